"""Object-store credentials from an Airflow connection, never from code and never logged.

An ``aws`` connection (login = access key id, password = secret key; extra ``endpoint_url`` for MinIO or any
S3-compatible store, ``region_name``, ``aws_session_token``) becomes the storage options of a build, which its
stage configs carry to every ``s3://`` URL they open, with botocore's adaptive retries, so transient 500s, 503
SlowDowns and dropped connections are retried with backoff. Without the connection, s3fs uses the default AWS
credential chain. Nothing is written into fsspec's process-wide configuration.
"""

from __future__ import annotations

import logging
from typing import Literal

log = logging.getLogger(__name__)

RETRIES = {"max_attempts": 10, "mode": "adaptive"}


def storage_options(conn_id: str | None, lookup: Literal["task", "secrets"] = "task") -> dict[str, dict]:
    """``{"s3": options}`` from the connection: looked up through the Task SDK in a task, or from the secrets
    backends and the metadata database in the api-server (where the builds page reads reports)."""
    from airflow.sdk.exceptions import AirflowNotFoundException

    if lookup == "task":
        from airflow.sdk import Connection

        get = Connection.get
    else:
        from airflow.models.connection import Connection

        get = Connection.get_connection_from_secrets
    options: dict = {"config_kwargs": {"retries": RETRIES}}
    conn = None
    if conn_id:
        try:
            conn = get(conn_id)
        except AirflowNotFoundException:
            log.info("no connection %r: s3:// uses the default AWS credential chain", conn_id)
    if conn is not None:
        extra = conn.extra_dejson
        if conn.login:
            options |= {"key": conn.login, "secret": conn.password}
        if extra.get("aws_session_token"):
            options["token"] = extra["aws_session_token"]
        client = {k: extra[k] for k in ("endpoint_url", "region_name") if extra.get(k)}
        if client:
            options["client_kwargs"] = client
        where = f" at {client['endpoint_url']}" if "endpoint_url" in client else ""
        log.info("s3:// uses connection %r%s", conn_id, where)
    return {"s3": options}
