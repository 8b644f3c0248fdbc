"""Errors a user acts on: the root every such error of the project derives from, a usage error (wrong arguments,
exit status 2), and the one-line form of failures raised by storage and network libraries (missing credentials,
unreachable hosts), whose tracebacks tell a user nothing more than their last line."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

EXTERNAL_MODULES = (
    "botocore",
    "aiobotocore",
    "s3fs",
    "aiohttp",
    "httpx",
    "httpx2",
    "requests",
    "urllib3",
    "huggingface_hub",
    "fsspec",
    "gcsfs",
    "adlfs",
)
CREDENTIALS_HINT = "set credentials in the environment, an AWS profile or the Airflow connection"


class TokenizationError(Exception):
    """Every error the project raises for a user to act on (bad input, a refused option, a build that fails its
    checks): the command line prints its one line. Any other exception is a bug, and shows its traceback."""


class UsageError(TokenizationError, ValueError):
    """The arguments are wrong (a value out of range, options that conflict): nothing was read or written."""


class StorageError(TokenizationError, OSError):
    """A storage location could not be reached or read; the message names it."""


class MissingError(TokenizationError, FileNotFoundError):
    """A file a command reads is not there (no ``LATEST`` yet, a folder that holds no build); the message names it."""


class WriteError(TokenizationError, OSError):
    """A file could not be written; the message names it and, locally, its filesystem."""


class AttemptConflict(TokenizationError):
    """Another attempt at the same output is alive; the message names it."""


class LeaseLost(TokenizationError):
    """This attempt's lease was taken over (it stalled past the TTL): it must not publish. Not a reason to retry:
    the attempt that took the lease over is doing the work."""


RETRIABLE = (StorageError, WriteError, AttemptConflict, LeaseLost)  # the project errors a later try may not meet


def external_error(exc: BaseException) -> str | None:
    """A one-line message for an error raised by a storage or network library, or None for any other error."""
    seen: list[BaseException] = []
    error: BaseException | None = exc
    while error is not None and error not in seen:
        if type(error).__module__.split(".")[0] in EXTERNAL_MODULES:
            lines = str(error).strip().splitlines()
            message = f"{type(error).__name__}: {lines[0] if lines else 'no details'}"
            return f"{message} ({CREDENTIALS_HINT})" if "credential" in message.lower() else message
        seen.append(error)
        error = error.__cause__ or error.__context__
    return None


@contextmanager
def reaching(url: str) -> Iterator[None]:
    """Name ``url`` in any storage or network failure raised inside, in one line. A project error passes as it is:
    it says what happened already, though a store's refusal that it answers may be its context (a lease found held
    once a conditional write failed)."""
    try:
        yield
    except TokenizationError:
        raise
    except Exception as exc:
        message = external_error(exc)
        if message is None:
            raise
        raise StorageError(f"{url}: {message}") from exc
