"""The DAG's Params, made from the library's ``BuildConfig`` (default, bounds, choices, title and help of every
field), so the trigger form, the command line and the library never disagree; plus the few that only Airflow
needs."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import MISSING
from typing import Any

from airflow.sdk import Param

from tokenization.builds.config import offered_params

FIRST = ("input", "output", "tokenizer")  # the trigger form opens with what every build sets
AIRFLOW = "Airflow"  # the section of the params that only the DAG has
MIXTURE, MIXTURE_FILE = "mixture", "mixture_file"
# Airflow 3.3's page shortcuts take some keys typed into the form's JSON editor ("weight" arrives as "weiht")
TYPING_NOTE = f". In this form: paste, don't type, or use {MIXTURE_FILE}"


def build_params(defaults: Mapping[str, object]) -> dict[str, Param]:
    """A Param for every field of ``BuildConfig`` offered as one; ``defaults`` (the deployment's input, output and
    tokenizer) replace the library's."""
    made = {}
    for p in offered_params():
        default = defaults.get(p.name, None if p.default is MISSING else p.default)
        heading = None if p.name in FIRST else p.section  # FIRST opens the form, unsectioned
        extra: dict[str, Any] = {"section": heading} if heading else {}  # (Param's keyword arguments are Any)
        description = p.help + TYPING_NOTE if p.name == MIXTURE else p.help
        made[p.name] = Param(default, title=p.title, description=description, **p.schema, **extra)
    ordered = [(name, made[name]) for name in FIRST] + [(k, v) for k, v in made.items() if k not in FIRST]
    at = [name for name, _ in ordered].index(MIXTURE) + 1  # the same spec as a file, right after the JSON
    return dict([*ordered[:at], (MIXTURE_FILE, mixture_file()), *ordered[at:]])


def mixture_file() -> Param:
    """The mixture as a file, which the trigger form takes where typing JSON is awkward (``tasks.config_of`` reads it
    as ``tokenization build --mixture FILE`` does)."""
    return Param(
        None,
        type=["null", "string"],
        minLength=1,
        title="Mixture file",
        description="a mixture spec in a YAML or JSON file (a path or URL within the allowed locations), in place of "
        f"the {MIXTURE} param: give one of the two (docs/mixtures.md)",
    )


def airflow_params() -> dict[str, Param]:
    """How Airflow reaches storage, reports progress and waits for ranks: no part of the build's bytes."""
    return {
        "aws_conn_id": Param(
            "aws_default",
            type="string",
            minLength=1,
            title="Storage connection",
            section=AIRFLOW,
            description="Airflow connection for s3:// URLs (credentials; endpoint_url in its extra for MinIO)",
        ),
        "progress_seconds": Param(
            30,
            type="number",
            minimum=1,
            title="Seconds between progress lines",
            section=AIRFLOW,
            description="each stage logs percent done, documents, tokens, tokens/s and ETA this often",
        ),
        "sensor_timeout": Param(
            6 * 3600,
            type="integer",
            minimum=1,
            title="Seconds to wait for the ranks",
            section=AIRFLOW,
            description="wait_for_shards fails after this long, naming the ranks still missing",
        ),
    }
