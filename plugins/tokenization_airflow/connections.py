"""Object-store credentials from an Airflow connection, never from code and never logged.

An ``aws`` connection (login = access key id, password = secret key; extra ``endpoint_url`` for MinIO or any
S3-compatible store, ``region_name``, ``aws_session_token``) becomes the storage options of a build, which its
stage configs carry to every ``s3://`` URL they open, with botocore's adaptive retries, so transient 500s, 503
SlowDowns and dropped connections are retried with backoff. Without the connection, s3fs uses the default AWS
credential chain. A connection of another type is refused by name before any request (the api-server's ``http``
connection would sign S3 requests that fail only after minutes of retries). Nothing is written into fsspec's
process-wide configuration.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Literal

from tokenization.errors import TokenizationError

log = logging.getLogger(__name__)

RETRIES = {"max_attempts": 10, "mode": "adaptive"}
S3_CONN_TYPE = "aws"  # the Amazon provider's type; any other (http, postgres, ...) holds no S3 credentials


class ConnectionTypeError(TokenizationError, ValueError):
    """The connection named for storage is of another type: its login would sign S3 requests that fail slowly."""


def storage_options(conn_id: str | None, lookup: Literal["task", "secrets"] = "task") -> dict[str, dict[str, Any]]:
    """``{"s3": options}`` from the connection: looked up through the Task SDK in a task, or from the secrets
    backends and the metadata database in the api-server (where the builds page reads reports)."""
    from airflow.sdk.exceptions import AirflowNotFoundException

    get: Callable[[str], Any]  # a connection of the Task SDK's, or of the metadata database's (their attributes alike)
    if lookup == "task":
        from airflow.sdk import Connection

        get = Connection.get
    else:
        from airflow.models.connection import Connection as StoredConnection

        get = StoredConnection.get_connection_from_secrets
    options: dict[str, Any] = {"config_kwargs": {"retries": RETRIES}}
    conn = None
    if conn_id:
        try:
            conn = get(conn_id)
        except AirflowNotFoundException:
            log.info("no connection %r: s3:// uses the default AWS credential chain", conn_id)
    if conn is not None:
        if conn.conn_type != S3_CONN_TYPE:
            raise ConnectionTypeError(
                f"connection {conn_id!r} is of type {conn.conn_type!r}, but s3:// needs one of type "
                f"{S3_CONN_TYPE!r}: name an {S3_CONN_TYPE} connection in aws_conn_id"
            )
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
