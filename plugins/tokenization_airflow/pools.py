"""Does a pool exist? Airflow would otherwise leave a task of a missing pool waiting forever, saying nothing.

Airflow 3 blocks the metadata database inside task processes, so the check reads it directly where that is
allowed (``dag.test``, ``airflow dags test``) and otherwise asks the REST API through the connection named by
``TOKENIZATION_AIRFLOW_API_CONN`` (default ``airflow_api``: host = the api-server URL, login and password).

Why by hand, with urllib: in Airflow 3.3.2 no public client reads a pool from a task process. The Task SDK
(``airflow.sdk``) has no pool API, and the Task Execution API it talks to serves connections, variables, XComs,
assets, DAG runs and task instances, but no pools. The public REST API's client, ``apache-airflow-client``
(``PoolApi.get_pool``), would do it, but it is not a dependency of this project.
"""

from __future__ import annotations

import json
import logging
import urllib.error
import urllib.request

from tokenization_airflow.deployment import deployment

log = logging.getLogger(__name__)


def pool_exists(name: str) -> bool | None:
    """True or False when it could be checked, None when neither the database nor the REST API is reachable."""
    found = _from_database(name)
    return found if found is not None else _from_rest_api(name)


def _from_database(name: str) -> bool | None:
    try:
        from airflow.models.pool import Pool
        from airflow.utils.session import create_session

        with create_session() as session:
            return session.query(Pool).filter(Pool.pool == name).first() is not None
    except Exception:  # blocked in task processes (RuntimeError / AttributeError), or no database
        return None


def _from_rest_api(name: str) -> bool | None:
    from airflow.sdk import Connection

    conn_id = deployment().api_conn_id
    try:
        conn = Connection.get(conn_id)
    except Exception:
        log.warning("cannot check pool %r: no database access here and no %r connection", name, conn_id)
        return None
    base = conn.host if "://" in (conn.host or "") else f"http://{conn.host}:{conn.port or 8080}"
    body = json.dumps({"username": conn.login, "password": conn.password}).encode()
    token_request = urllib.request.Request(
        f"{base}/auth/token", data=body, headers={"Content-Type": "application/json"}, method="POST"
    )
    with urllib.request.urlopen(token_request, timeout=30) as response:
        token = json.load(response)["access_token"]
    pool_request = urllib.request.Request(f"{base}/api/v2/pools/{name}", headers={"Authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(pool_request, timeout=30):
            return True
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            return False
        raise
