"""The shard sensor: waits until every rank's shard is complete on storage (marker present, manifest intact), for as
long as every missing rank can still finish. It waits deferred, checking from the triggerer: a sensor in
reschedule mode is *running* for the few seconds of each poke, and clearing a failed rank (whose downstream
includes the sensor) is then refused ("AirflowClearRunningTaskException"), or its clear dialog stops at a
warning, by chance; a deferred sensor is never running while it waits."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

from airflow.sdk import BaseSensorOperator, Context, PokeReturnValue
from airflow.sdk.exceptions import AirflowSensorTimeout
from airflow.triggers.base import BaseTrigger, TriggerEvent
from asgiref.sync import sync_to_async

from tokenization.builds.run import Build
from tokenization.errors import TokenizationError
from tokenization_airflow.tasks import build_of, is_data_error, one_line, one_line_failures

NEVER_FINISHING = ("upstream_failed", "removed", "skipped")  # states a rank's task cannot leave by itself
TRIGGER_GRACE = 300  # s past sensor_timeout before Airflow fails a sensor whose trigger never ran (no triggerer)


class ShardsCannotComplete(TokenizationError):
    """A missing rank can never finish, or the shards fail the build's checks: waiting longer cannot help."""


def listed(ranks: dict[int, str]) -> str:
    return ", ".join(f"rank {rank} ({why})" for rank, why in sorted(ranks.items()))


def waiting(missing: dict[int, str], build: Build) -> str:
    return f"waiting for {len(missing)} of {build.config.num_ranks} ranks: {listed(missing)}"


def missing_shards(
    build: Build, dag_id: str, run_id: str, ranks_task_id: str
) -> tuple[list[int | None] | None, dict[int, str]]:
    """``(the merge's buckets, {})`` when every rank's shard of the run's ``build`` is complete, else ``(None,
    {rank: why it is missing})``. Raises ``ShardsCannotComplete`` when a missing rank's task was never created or
    can never run (a failed one can still be cleared)."""
    from airflow.sdk.execution_time.task_runner import RuntimeTaskInstance

    missing = build.incomplete_ranks()
    if not missing:
        return build.merge_buckets, {}
    states = RuntimeTaskInstance.get_task_states(dag_id=dag_id, task_ids=[ranks_task_id], run_ids=[run_id])
    states = states.get(run_id, {})
    if ranks_task_id in states:  # never expanded: plan failed
        raise ShardsCannotComplete(
            f"no rank was created ({ranks_task_id} is {states[ranks_task_id]}): plan failed, see its log"
        )
    hopeless = {
        rank: states.get(key, "never created")
        for rank, key in ((rank, f"{ranks_task_id}_{rank}") for rank in missing)
        if key not in states or states[key] in NEVER_FINISHING
    }  # a cleared rank's state is None for a moment: it can still finish
    if hopeless:
        raise ShardsCannotComplete(f"ranks that can never finish, so the build cannot: {listed(hopeless)}")
    return None, missing


class ShardSensor(BaseSensorOperator):
    """Succeeds when all ranks of the run ``spec`` (from ``plan``: ``run_dir``, ``num_ranks``) are complete;
    meant for ``trigger_rule="all_done"``: it starts once every rank has finished or failed, and while a failed
    rank is cleared and re-run it waits deferred (``ShardTrigger`` checks every ``poke_interval``). It fails at
    once when a rank can never finish (``plan`` failed, so no rank was created; or a rank is upstream_failed).
    ``sensor_timeout`` (seconds, templated) replaces ``timeout``; on timeout the missing ranks are named. Done, it
    returns what each merge task takes (the build's buckets, or ``[None]`` for one merge of everything), which
    the merge is mapped over."""

    template_fields = ("spec", "sensor_timeout")

    def __init__(
        self, *, spec: dict[str, Any], sensor_timeout: int | str, ranks_task_id: str = "tokenize", **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        self.spec = spec
        self.sensor_timeout = sensor_timeout
        self.ranks_task_id = ranks_task_id

    def execute(self, context: Context) -> Any:
        found = self.poke(context)
        if found.is_done:
            return found.xcom_value
        ti, timeout = context["ti"], float(self.sensor_timeout)
        trigger = ShardTrigger(
            params=dict(context["params"]),
            spec=self.spec,
            dag_id=ti.dag_id,
            run_id=ti.run_id,
            ranks_task_id=self.ranks_task_id,
            poke_interval=float(self.poke_interval),
            deadline=time.time() + timeout,
        )
        self.defer(trigger=trigger, method_name="resume", timeout=timedelta(seconds=timeout + TRIGGER_GRACE))

    @one_line_failures
    def poke(self, context: Context) -> PokeReturnValue:
        ti, build = context["ti"], build_of(context["params"], self.spec)
        buckets, missing = missing_shards(build, ti.dag_id, ti.run_id, self.ranks_task_id)
        if missing:
            self.log.info(waiting(missing, build))
        return PokeReturnValue(is_done=not missing, xcom_value=buckets)

    @one_line_failures
    def resume(self, context: Context, event: dict[str, Any]) -> Any:
        """Where the task goes on when ``ShardTrigger`` fires: done, hopeless, or out of time."""
        if "failure" in event:
            raise ShardsCannotComplete(event["failure"])
        if "missing" in event:
            missing = {rank: why for rank, why in event["missing"]}
            raise AirflowSensorTimeout(
                f"shards still missing after {float(self.sensor_timeout):.0f}s: {listed(missing)}"
            )
        return event["buckets"]


class ShardTrigger(BaseTrigger):
    """Checks the shards of a run every ``poke_interval`` seconds in the triggerer until they are complete, a
    missing rank can never finish, or ``deadline`` (a Unix time) passes; fires once, with ``buckets``,
    ``failure`` or ``missing``. It logs the missing ranks whenever they change. A storage error is logged and the
    check made again at the next interval; a data error fires ``failure`` at once."""

    def __init__(
        self,
        *,
        params: dict[str, Any],
        spec: dict[str, Any],
        dag_id: str,
        run_id: str,
        ranks_task_id: str,
        poke_interval: float,
        deadline: float,
    ):
        super().__init__()
        self.kwargs: dict[str, Any] = {
            "params": params,
            "spec": spec,
            "dag_id": dag_id,
            "run_id": run_id,
            "ranks_task_id": ranks_task_id,
            "poke_interval": poke_interval,
            "deadline": deadline,
        }

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return f"{type(self).__module__}.{type(self).__qualname__}", self.kwargs

    async def run(self) -> AsyncIterator[TriggerEvent]:
        k = self.kwargs
        run = (k["dag_id"], k["run_id"], k["ranks_task_id"])
        build: Build | None = None  # the run's build once made
        last: dict[int, str] = {}  # the missing ranks last seen
        while True:
            try:
                build = build or await sync_to_async(build_of)(k["params"], k["spec"])
                buckets, missing = await sync_to_async(missing_shards)(build, *run)
            except Exception as exc:
                if is_data_error(exc):
                    yield TriggerEvent({"failure": one_line(exc)})
                    return
                self.log.warning("checking the shards failed, trying again: %s", one_line(exc))
            else:
                if not missing:
                    yield TriggerEvent({"buckets": buckets})
                    return
                if missing != last:
                    self.log.info(waiting(missing, build))
                last = missing
            if time.time() >= k["deadline"]:
                yield TriggerEvent({"missing": sorted(last.items())})
                return
            await asyncio.sleep(k["poke_interval"])
