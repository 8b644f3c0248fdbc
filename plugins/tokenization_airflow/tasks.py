"""What the ``tokenize_corpus`` DAG's tasks need besides the library: the checks that only a deployment can make
(misspelled conf keys, Airflow's map limit, allowed locations, the merge pool), the ``Build`` of a run, made
from its params, its plan and the deployment's storage connection and working folders, and which errors fail a
task at once.
"""

from __future__ import annotations

import difflib
import functools
import logging
from collections.abc import Callable
from typing import Any, ParamSpec, TypeVar

from airflow.sdk import get_current_context
from airflow.sdk.exceptions import AirflowFailException

from tokenization.builds.config import BuildConfig, offered_params
from tokenization.builds.run import Build
from tokenization.errors import RETRIABLE, TokenizationError, external_error
from tokenization.mixing.spec import load_mixture_file
from tokenization.storage.folder import StorageOptions
from tokenization.storage.locations import malformed_url
from tokenization_airflow.connections import storage_options
from tokenization_airflow.deployment import deployment
from tokenization_airflow.params import MIXTURE, MIXTURE_FILE
from tokenization_airflow.pools import pool_exists

log = logging.getLogger(__name__)

MAP_LENGTH_FALLBACK = 1024  # Airflow's default [core] max_map_length
BUILD_PARAMS = {param.name for param in offered_params()}
FAILURE_KEY = "failure"  # the XCom holding a failed try's one-line cause
FAILURE_CHARS = 2000  # of it: a cause is a line, not a log
P = ParamSpec("P")
R = TypeVar("R")
T = TypeVar("T")


class PlanError(TokenizationError):
    """The run cannot start: a param or the deployment is wrong."""


def check_conf(conf: dict[str, Any], declared: set[str]) -> None:
    """Refuse keys of the run's conf that are no param: a misspelled param would otherwise be ignored."""
    unknown = sorted(set(conf) - declared)
    if unknown:
        raise PlanError(f"unknown params in the run's conf: {', '.join(_hint(k, declared) for k in unknown)}")


def _hint(key: str, declared: set[str]) -> str:
    close = difflib.get_close_matches(key, declared, 1)
    return f"{key!r} (did you mean {close[0]!r}?)" if close else repr(key)


def check_map_length(params: dict[str, Any], max_map_length: int) -> None:
    """Ranks and buckets are mapped tasks: Airflow refuses to create more than ``[core] max_map_length``."""
    for name in ("num_ranks", "num_buckets"):
        if (params.get(name) or 0) > max_map_length:
            raise PlanError(
                f"param {name}={params[name]} exceeds Airflow's [core] max_map_length={max_map_length} (the most "
                f"mapped tasks it creates): raise it (AIRFLOW__CORE__MAX_MAP_LENGTH) on every component, or use fewer"
            )


def check_merge_pool(merges: bool) -> None:
    """A task of a missing pool would wait forever, saying nothing."""
    pool = deployment().merge_pool
    found = pool_exists(pool) if merges else None
    log.info("merge pool %r: %s", pool, {True: "exists", False: "MISSING", None: "could not be checked"}[found])
    if found is False:
        raise PlanError(
            f"pool {pool!r} does not exist, so the merge would wait forever: "
            f"create it with `airflow pools set {pool} 1 'corpus-tokenization merge'`"
        )


def config_of(params: dict[str, Any]) -> BuildConfig:
    """The build's config: the run's params (a ``mixture_file`` read into its mixture), the storage connection they
    name, the deployment's working folders."""
    here = deployment()
    given = {name: value for name, value in params.items() if name in BUILD_PARAMS}
    options = storage_options(params["aws_conn_id"])
    if params.get(MIXTURE_FILE) is not None:
        given[MIXTURE] = mixture_of_file(params[MIXTURE_FILE], params.get(MIXTURE), options)
    return BuildConfig(
        **given, storage_options=options, local_working_dir=here.workdir, merge_working_dir=here.merge_workdir
    )


def mixture_of_file(location: str, mixture: dict[str, Any] | None, options: StorageOptions) -> dict[str, Any]:
    """The mixture the ``mixture_file`` param names, read as ``tokenization build --mixture FILE`` reads one, once
    its location is checked as the build's own are: well formed, and within the allowed locations."""
    if mixture is not None:
        raise PlanError(f"give the {MIXTURE} param (JSON) or {MIXTURE_FILE}, not both")
    if wrong := malformed_url(location):
        raise PlanError(f"{MIXTURE_FILE} {wrong}")
    deployment().allowed_locations.check(MIXTURE_FILE, location)
    return load_mixture_file(location, options)


def plan(params: dict[str, Any], run_id: str, conf: dict[str, Any], declared: set[str], max_map_length: int) -> Build:
    """Check everything that can be checked before any work, then start the build (which claims its folder)."""
    check_conf(conf, declared)
    check_map_length(params, max_map_length)
    config = config_of(params)  # the option layer's checks first: a malformed URL is named as such
    check_merge_pool(config.output_format == "ds")
    build = Build.start(config, run_id, deployment().allowed_locations)
    build.unpublish()  # a run cleared whole rewrites its files: it is not complete until it publishes again
    return build


def passed(value: T | None, name: str) -> T:
    """What Airflow passes a task by its parameter's ``name`` (``params``, ``run_id``): None only outside a run."""
    if value is None:
        raise RuntimeError(f"the task was passed no {name}: Airflow passes it to every task of a run")
    return value


def build_of(params: dict[str, Any], spec: dict[str, Any]) -> Build:
    """The run's build in a later task: its params, and the run that ``plan`` named in XCom ``spec``."""
    return Build.of(config_of(params), spec, "the plan task's spec (XCom)")


def is_data_error(exc: BaseException) -> bool:
    """Whether running the task again would fail the same way: bad input, a refused param, a build that fails its
    checks: every ``TokenizationError`` but the ``RETRIABLE`` ones. Storage, write and network errors are not, nor a
    conflict with a live attempt (``AttemptConflict``, ``LeaseLost``): a later try may succeed."""
    return isinstance(exc, TokenizationError) and not isinstance(exc, RETRIABLE)


def one_line_failures(func: Callable[P, R]) -> Callable[P, R]:
    """A task (or a sensor's poke) whose failure is one line: its cause, recorded as the try's XCom ``failure``
    for the "Corpus builds" page, and logged. A data error fails it without retries, which would only repeat it
    minutes apart; its cause is then also the last line of the short traceback that Airflow logs next."""

    @functools.wraps(func)
    def run(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return func(*args, **kwargs)
        except Exception as exc:
            cause = one_line(exc)
            _record_failure(cause)
            if not is_data_error(exc):
                raise
            log.error("%s (a data error: the task fails without retries)", cause)
            raise AirflowFailException(cause) from None

    return run


def one_line(exc: BaseException) -> str:
    """What a person can act on: a project error's message, a storage library's last line, else the type too."""
    if isinstance(exc, TokenizationError):
        return str(exc)
    return external_error(exc) or f"{type(exc).__name__}: {exc}".splitlines()[0]


def _record_failure(cause: str) -> None:
    """The cause as this try's XCom (a later try starts without it); outside a running task there is none."""
    try:
        get_current_context()["ti"].xcom_push(FAILURE_KEY, cause[:FAILURE_CHARS])
    except Exception as exc:  # recording must never hide the failure itself
        log.warning("the failure's cause could not be recorded: %s", exc)
