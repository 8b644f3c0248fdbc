"""The "Corpus builds" page: a FastAPI app that Airflow's api-server mounts at ``/corpus-builds``.

Plugin apps are open by default in Airflow 3; every route here requires Airflow's own login (the UI's ``_token``
cookie or a bearer token) and read access to the DAG's runs. Reports are served only for runs that exist, from
the run folder their ``plan`` task recorded (no path ever comes from the request) and only when that folder lies
inside the deployment's allowed locations. Every page goes out with a Content-Security-Policy that forbids
scripts, so a report's HTML can never run code in Airflow's origin.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Annotated, Any
from urllib.parse import quote

from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.exception_handlers import http_exception_handler
from fastapi.responses import HTMLResponse, Response

from tokenization.builds.pages import render
from tokenization.builds.report import published_summary, read_report
from tokenization.builds.run import Build
from tokenization.errors import TokenizationError
from tokenization_airflow.connections import storage_options
from tokenization_airflow.deployment import deployment
from tokenization_airflow.tasks import FAILURE_KEY

log = logging.getLogger(__name__)

PREFIX = "/corpus-builds"
DAG_ID = "tokenize_corpus"
RUNS_SHOWN = 100
# No scripts, no outside resources, no forms; inline styles and data: images only (the report's SVG is inline).
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'; img-src data:; "
    "frame-ancestors 'self'; base-uri 'none'; form-action 'none'",
    "X-Content-Type-Options": "nosniff",
}

app = FastAPI(title="Corpus builds", docs_url=None, redoc_url=None, openapi_url=None)


async def authenticated_user(request: Request) -> Any:
    """The logged-in Airflow user, from a bearer token or the UI's cookie: 401 without, 403 if invalid."""
    from airflow.api_fastapi.auth.managers.base_auth_manager import COOKIE_NAME_JWT_TOKEN
    from airflow.api_fastapi.core_api.security import resolve_user_from_token

    header = request.headers.get("authorization", "")
    token = header[7:] if header.lower().startswith("bearer ") else request.cookies.get(COOKIE_NAME_JWT_TOKEN)
    return await resolve_user_from_token(token)


def readable_dag(dag_id: str, user: Any) -> None:
    """403 unless the user may read this DAG's runs."""
    from airflow.api_fastapi.app import get_auth_manager
    from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity, DagDetails

    allowed = get_auth_manager().is_authorized_dag(
        method="GET", access_entity=DagAccessEntity.RUN, details=DagDetails(id=dag_id), user=user
    )
    if not allowed:
        raise HTTPException(403, f"no read access to the runs of {dag_id}")


User = Annotated[object, Depends(authenticated_user)]


def report_url(dag_id: str, run_id: str) -> str:
    return f"{PREFIX}/dags/{quote(dag_id, safe='')}/runs/{quote(run_id, safe='')}"


def list_builds(dag_id: str, limit: int = RUNS_SHOWN) -> list[dict[str, Any]]:
    """The DAG's runs, newest first (by when they started; those waiting to start first), with what ``publish``
    recorded of each finished build, or why a failed one failed."""
    from airflow.models.dagrun import DagRun
    from airflow.models.taskinstance import TaskInstance
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        newest = (DagRun.start_date.desc().nulls_first(), DagRun.run_after.desc())
        runs = session.scalars(select(DagRun).where(DagRun.dag_id == dag_id).order_by(*newest).limit(limit)).all()
        run_ids = [r.run_id for r in runs]
        published: dict[str, Any] = dict(  # run id: what its publish task returned
            session.execute(
                select(XComModel.run_id, XComModel.value).where(
                    XComModel.dag_id == dag_id,
                    XComModel.task_id == "publish",
                    XComModel.key == "return_value",
                    XComModel.run_id.in_(run_ids),
                )
            ).all()
        )
        failed = session.execute(
            select(TaskInstance.run_id, TaskInstance.task_id, TaskInstance.map_index)
            .where(TaskInstance.dag_id == dag_id, TaskInstance.state == "failed", TaskInstance.run_id.in_(run_ids))
            .order_by(TaskInstance.end_date)
        ).all()
        causes = {
            (run_id, task_id, map_index): value
            for run_id, task_id, map_index, value in session.execute(
                select(XComModel.run_id, XComModel.task_id, XComModel.map_index, XComModel.value).where(
                    XComModel.dag_id == dag_id, XComModel.key == FAILURE_KEY, XComModel.run_id.in_(run_ids)
                )
            )
        }
        first_failures: dict[str, dict[str, Any]] = {}
        for run_id, task_id, map_index in failed:  # the first task to fail is the cause; the rest follow from it
            task = task_id if map_index < 0 else f"{task_id}[{map_index}]"
            cause = causes.get((run_id, task_id, map_index)) or "no cause recorded: see the task's log"
            first_failures.setdefault(run_id, {"task": task, "cause": cause})
        return [_build_row(run, published.get(run.run_id), first_failures.get(run.run_id)) for run in runs]


def _build_row(run: Any, published: dict[str, Any] | None, failure: dict[str, Any] | None) -> dict[str, Any]:
    """A run, what its ``publish`` returned (``None`` until the build is published; a summary that cannot be
    read leaves the figures out, with a warning), and its first failed task with the cause (``None`` without)."""
    build = None
    try:
        if published:
            build = published_summary(published, f"the summary run {run.run_id!r} published (XCom)")
    except TokenizationError as exc:  # a summary that is no BuildSummary: said, and left out
        log.warning("%s", exc)
    # a published build's times are its record's: clearing a task restarts the Airflow run's clock
    started, seconds = (build.started, build.wall_seconds) if build and build.started else (None, None)
    if started is None:
        started = _iso(run.start_date)
        seconds = (run.end_date - run.start_date).total_seconds() if run.start_date and run.end_date else None
    return {
        "run_id": run.run_id,
        "state": str(run.state),
        "failure": failure,
        "date": _iso(run.logical_date or run.run_after),
        "started": started,
        "seconds": round(seconds, 1) if seconds is not None else None,
        "tokens": build and build.tokens,
        "docs": build and build.docs,
        "rejects": build and build.rejects,
        "dataset": build and build.dataset,
        "tokenizer": build and build.tokenizer,
        "input": build and build.input,
        "seed": build and build.seed,
        "reused": build and build.reused,
        "footprint": build and build.footprint and build.footprint.to_json(),
        "mixture": build and build.mixture and [source.to_json() for source in build.mixture],
    }


def _iso(moment: datetime | None) -> str | None:
    return moment.isoformat(timespec="seconds") if moment else None


def recorded_run_dir(dag_id: str, run_id: str) -> tuple[str, str | None]:
    """The run's folder and storage connection, as its ``plan`` task recorded them; 404 for unknown runs."""
    from airflow.models.dagrun import DagRun
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        run = session.scalars(select(DagRun).where(DagRun.dag_id == dag_id, DagRun.run_id == run_id)).first()
        if run is None:
            raise HTTPException(404, f"{dag_id} has no run {run_id!r}")
        spec = session.scalar(
            select(XComModel.value).where(
                XComModel.dag_id == dag_id,
                XComModel.run_id == run_id,
                XComModel.task_id == "plan",
                XComModel.key == "spec",
            )
        )
        if not spec:
            raise HTTPException(404, f"run {run_id!r} of {dag_id} planned no corpus build (state: {run.state})")
        run_dir = Build.run_dir_of(spec, f"the spec run {run_id!r} planned (XCom)")
        return run_dir, (run.conf or {}).get("aws_conn_id")


@app.exception_handler(HTTPException)
async def refusal(request: Request, exc: HTTPException) -> Response:
    """A refusal as a page that a person reads in the UI's frame (its text wraps), or as JSON for API clients."""
    if "text/html" not in request.headers.get("accept", ""):
        return await http_exception_handler(request, exc)
    page = render("refusal.html.j2", status=exc.status_code, detail=exc.detail)
    return HTMLResponse(page, status_code=exc.status_code, headers={**(exc.headers or {}), **SECURITY_HEADERS})


@app.get("/api/builds")
def builds_json(user: User, dag_id: str = DAG_ID) -> list[dict[str, Any]]:
    readable_dag(dag_id, user)
    return list_builds(dag_id)


@app.get("/", response_class=HTMLResponse)
def builds_page(user: User, dag_id: str = DAG_ID) -> HTMLResponse:
    readable_dag(dag_id, user)
    page = render("builds.html.j2", dag_id=dag_id, builds=list_builds(dag_id), report_url=report_url)
    return HTMLResponse(page, headers=SECURITY_HEADERS)


@app.get("/dags/{dag_id}/runs/{run_id}", response_class=HTMLResponse)
def build_report(user: User, dag_id: str, run_id: str) -> HTMLResponse:
    readable_dag(dag_id, user)
    folder, conn_id = recorded_run_dir(dag_id, run_id)
    if not deployment().allowed_locations.allows(folder):
        raise HTTPException(403, f"run {run_id!r} wrote outside the allowed locations: its report is not served")
    options = storage_options(conn_id or "aws_default", lookup="secrets")  # for this request only
    try:
        return HTMLResponse(read_report(folder, options), headers=SECURITY_HEADERS)
    except FileNotFoundError:
        raise HTTPException(404, f"run {run_id!r} has no report yet: it is written when the build publishes") from None
