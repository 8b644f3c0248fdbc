"""Writes and removals under a condition: a small object put only where none is, or only over the version a caller
read, and removed only in that version. S3 enforces the condition itself (``If-None-Match``, ``If-Match``); a local
file is created with ``O_EXCL``; other stores are looked at first. Where S3 servers differ, this says so.

Private to ``storage``, as ``files`` is: the layers above say which version they replace through ``folder.Folder``.
"""

from __future__ import annotations

import errno
import os
from typing import TYPE_CHECKING

from tokenization.storage.files import is_local, is_s3, remove_if_exists, write_bytes_atomic, writing

if TYPE_CHECKING:
    import fsspec


def put_if(
    fs: fsspec.AbstractFileSystem, path: str, data: bytes, *, absent: bool = False, etag: str | None = None
) -> str | None:
    """Write a small object only if it does not exist yet (``absent``) or still has ``etag``; return its new ETag
    (None where the store has none). A failed condition raises ``FileExistsError``, and ``etag`` on an object that
    is gone ``FileNotFoundError``. S3 enforces the condition itself (``If-None-Match`` / ``If-Match``); a local
    file is created with ``O_EXCL``; other stores are checked first, which leaves a race that callers must say
    they cannot exclude."""
    if is_s3(fs):
        bucket, key, _ = fs.split_path(path)
        condition = {"IfNoneMatch": "*"} if absent else {"IfMatch": etag} if etag else {}
        try:
            return fs.call_s3("put_object", Bucket=bucket, Key=key, Body=data, **condition)["ETag"]
        except OSError as exc:
            if condition and _condition_failed(exc):
                if etag and not absent and _gone(fs, path):  # SeaweedFS's answer to If-Match on a missing key
                    raise FileNotFoundError(errno.ENOENT, f"{path}: gone, removed by another writer") from exc
                raise FileExistsError(errno.EEXIST, f"{path}: changed by another writer") from exc
            raise
        finally:
            fs.invalidate_cache(path)
    if absent and is_local(fs):
        with writing(path):
            fs.makedirs(os.path.dirname(path), exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)  # FileExistsError when it exists
        with writing(path), os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        return None
    if absent and fs.exists(path):
        raise FileExistsError(errno.EEXIST, f"{path}: exists")
    write_bytes_atomic(fs, path, data)
    return None


def current_etag(fs: fsspec.AbstractFileSystem, path: str) -> str | None:
    """An S3 object's ETag as the store has it now (not as cached), None when there is no such object: the
    condition for a later ``put_if`` or ``remove_if`` that must not touch a version written since."""
    fs.invalidate_cache(path)
    try:
        return fs.info(path).get("ETag")
    except FileNotFoundError:
        return None


def remove_if(fs: fsspec.AbstractFileSystem, path: str, etag: str | None) -> None:
    """Delete an S3 object only if it still has ``etag`` (a conditional ``DeleteObject``): a changed object stays
    and ``FileExistsError`` is raised; an object already gone is no error. Without an ``etag``, and on stores
    that cannot delete under a condition, the file is removed if it is there."""
    if not is_s3(fs) or etag is None:
        remove_if_exists(fs, path)
        return
    bucket, key, _ = fs.split_path(path)
    try:
        fs.call_s3("delete_object", Bucket=bucket, Key=key, IfMatch=etag)
    except FileNotFoundError:
        pass
    except OSError as exc:
        if not _condition_failed(exc):
            raise
        if not _gone(fs, path):  # SeaweedFS's 412 for a key already gone: no error, as AWS's 404
            raise FileExistsError(errno.EEXIST, f"{path}: changed by another writer") from exc
    finally:
        fs.invalidate_cache(path)


def _condition_failed(exc: OSError) -> bool:
    """Whether S3 refused a request for its condition: 412, or 409 when a concurrent conditional write won. s3fs
    turns these into a FileExistsError or an EINVAL or EIO OSError (as it does other errors), keeping the response
    on the cause.

    Stores differ on ``If-Match`` over a key that does not exist: AWS and moto answer 404 NoSuchKey (s3fs raises
    FileNotFoundError, which is never taken for this), SeaweedFS 412 PreconditionFailed, as for a changed object.
    The callers that must tell the two apart ask the store again (``_gone``) after a 412 to an ``If-Match``."""
    error = getattr(exc.__cause__, "response", None) or {}
    return error.get("Error", {}).get("Code") in ("PreconditionFailed", "ConditionalRequestConflict")


def _gone(fs: fsspec.AbstractFileSystem, path: str) -> bool:
    """Whether an object whose ``If-Match`` failed is missing rather than changed: one HEAD, after the refusal. An
    object made again since is found changed, as it is; one removed since, gone, as it is."""
    return current_etag(fs, path) is None
