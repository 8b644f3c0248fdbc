"""The shard sensor: waits until every rank's shard is complete on storage (marker present, manifest intact), for as
long as every missing rank can still finish."""

from __future__ import annotations

from airflow.sdk import BaseSensorOperator, PokeReturnValue
from airflow.sdk.exceptions import AirflowFailException, AirflowSensorTimeout

from tokenization_airflow.tasks import build_of, one_line_failures

NEVER_FINISHING = ("upstream_failed", "removed", "skipped")  # states a rank's task cannot leave by itself


class ShardSensor(BaseSensorOperator):
    """Succeeds when all ranks of the run ``spec`` (from ``plan``: ``run_dir``, ``num_ranks``) are complete;
    meant for ``mode="reschedule"`` and ``trigger_rule="all_done"``, so that it keeps waiting while a failed rank
    is cleared and re-run. It fails at once when a rank can never finish (``plan`` failed, so no rank was
    created; or a rank is upstream_failed). ``sensor_timeout`` (seconds, templated) replaces ``timeout``; on
    timeout the missing ranks are named. Done, it returns what each merge task takes (the build's buckets, or
    ``[None]`` for one merge of everything), which the merge is mapped over."""

    template_fields = ("spec", "sensor_timeout")

    def __init__(self, *, spec: dict, sensor_timeout: int | str, ranks_task_id: str = "tokenize", **kwargs):
        super().__init__(**kwargs)
        self.spec = spec
        self.sensor_timeout = sensor_timeout
        self.ranks_task_id = ranks_task_id
        self._missing: dict[int, str] = {}

    def execute(self, context):
        self.timeout = float(self.sensor_timeout)
        try:
            return super().execute(context)
        except AirflowSensorTimeout as exc:
            missing = ", ".join(f"rank {r} ({why})" for r, why in sorted(self._missing.items()))
            raise AirflowSensorTimeout(f"shards still missing after {self.timeout:.0f}s: {missing}") from exc

    @one_line_failures
    def poke(self, context) -> PokeReturnValue:
        build = build_of(context["params"], self.spec)
        self._missing = build.incomplete_ranks()
        if self._missing:
            self._fail_if_hopeless(context, self._missing)
            self.log.info(
                "waiting for %d of %d ranks: %s", len(self._missing), build.plan.num_ranks, sorted(self._missing)
            )
        return PokeReturnValue(is_done=not self._missing, xcom_value=build.plan.merge_buckets)

    def _fail_if_hopeless(self, context, missing: dict[int, str]) -> None:
        """Fail now if a missing rank's task was never created or can never run; a failed one may be cleared."""
        ti = context["ti"]
        states = ti.get_task_states(dag_id=ti.dag_id, task_ids=[self.ranks_task_id], run_ids=[ti.run_id])
        states = states.get(ti.run_id, {})
        if self.ranks_task_id in states:  # never expanded: plan failed
            raise AirflowFailException(
                f"no rank was created ({self.ranks_task_id} is {states[self.ranks_task_id]}): plan failed, see its log"
            )
        keys = {rank: f"{self.ranks_task_id}_{rank}" for rank in missing}
        hopeless = {
            rank: states.get(key, "never created")
            for rank, key in keys.items()
            if key not in states or states[key] in NEVER_FINISHING
        }  # a cleared rank's state is None for a moment: it can still finish
        if hopeless:
            listed = ", ".join(f"rank {rank} ({state})" for rank, state in sorted(hopeless.items()))
            raise AirflowFailException(f"ranks that can never finish, so the build cannot: {listed}")
