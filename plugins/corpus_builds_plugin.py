"""Registers the "Corpus builds" page (a FastAPI app), its menu entry, a "Build report" tab on every DAG run and
a "Build report" link on the ``publish`` task. The page itself lives in ``tokenization_airflow.builds_page``."""

from __future__ import annotations

from typing import Any, ClassVar

from airflow.plugins_manager import AirflowPlugin
from airflow.sdk import BaseOperator, BaseOperatorLink
from airflow.sdk.types import TaskInstanceKey
from tokenization_airflow.builds_page import DAG_ID, PREFIX, app, report_url


class BuildReportLink(BaseOperatorLink):
    """On the DAG's ``publish`` task, a link to its run's report; computed by the api-server when shown. A global
    link, since a TaskFlow task's operator class is private (a plugin's ``operator_extra_links`` must name the
    class); on every other task it is empty, and the UI shows no button."""

    name = "Build report"

    def get_link(self, operator: BaseOperator, *, ti_key: TaskInstanceKey) -> str:
        publish = ti_key.dag_id == DAG_ID and ti_key.task_id == "publish"
        return report_url(ti_key.dag_id, ti_key.run_id) if publish else ""


class CorpusBuildsPlugin(AirflowPlugin):
    name = "corpus_builds"
    # The ignores below: AirflowPlugin annotates these class-level lists as instance variables, which mypy refuses
    # to see overridden by class variables.
    fastapi_apps: ClassVar[list[Any]] = [{"app": app, "url_prefix": PREFIX, "name": "Corpus builds"}]  # type: ignore[misc]
    external_views: ClassVar[list[Any]] = [  # type: ignore[misc]  # (see above)
        {
            "name": "Corpus builds",
            "href": f"{PREFIX}/",
            "url_route": "corpus-builds",
            "destination": "nav",
            "category": "browse",
        },
        {
            "name": "Build report",
            "href": f"{PREFIX}/dags/{{DAG_ID}}/runs/{{RUN_ID}}",
            "url_route": "build-report",
            "destination": "dag_run",
        },
    ]
    global_operator_extra_links: ClassVar[list[Any]] = [BuildReportLink()]  # type: ignore[misc]  # (see above)
