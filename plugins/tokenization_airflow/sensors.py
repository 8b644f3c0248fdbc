"""The shard sensor: waits until every rank's shard is complete on storage (marker present, manifest intact)."""

from __future__ import annotations

from airflow.sdk import BaseSensorOperator, PokeReturnValue
from airflow.sdk.exceptions import AirflowSensorTimeout

from tokenization.build import Layout, incomplete_ranks
from tokenization_airflow.storage import use_connection


class ShardSensor(BaseSensorOperator):
    """Succeeds when all ranks of the run ``spec`` (from ``plan``: ``run_dir``, ``num_ranks``) are complete;
    meant for ``mode="reschedule"`` and ``trigger_rule="all_done"``, so that it keeps waiting while a failed rank
    is cleared and re-run. ``sensor_timeout`` (seconds, templated) replaces ``timeout``; on timeout the missing
    ranks are named."""

    template_fields = ("spec", "sensor_timeout")

    def __init__(self, *, spec: dict, sensor_timeout: int | str, **kwargs):
        super().__init__(**kwargs)
        self.spec = spec
        self.sensor_timeout = sensor_timeout
        self._missing: dict[int, str] = {}

    def execute(self, context):
        self.timeout = float(self.sensor_timeout)
        try:
            return super().execute(context)
        except AirflowSensorTimeout as exc:
            missing = ", ".join(f"rank {r} ({why})" for r, why in sorted(self._missing.items()))
            raise AirflowSensorTimeout(f"shards still missing after {self.timeout:.0f}s: {missing}") from exc

    def poke(self, context) -> PokeReturnValue:
        use_connection(context["params"]["aws_conn_id"])
        num_ranks = self.spec["num_ranks"]
        self._missing = incomplete_ranks(Layout(self.spec["run_dir"]).ranks, num_ranks)
        if self._missing:
            self.log.info("waiting for %d of %d ranks: %s", len(self._missing), num_ranks, sorted(self._missing))
        return PokeReturnValue(is_done=not self._missing)
