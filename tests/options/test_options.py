"""Every option is declared once, on a stage config: the command line and the DAG's Params are made from it."""

from __future__ import annotations

import argparse
import math
from typing import Any

import pytest

from tokenization.builds.config import BuildConfig
from tokenization.cli import build_parser
from tokenization.errors import UsageError
from tokenization.options import LOCATIONS, fields_of, json_schema, section
from tokenization.stages.context_shuffle import ContextOptions, ContextShuffleConfig
from tokenization.stages.count import CountConfig
from tokenization.stages.merge.config import MergeConfig, MergeOptions
from tokenization.stages.tokenize import RankOptions, TokenizeConfig
from tokenization.tokenizer.documents import DocumentOptions

MINIMAL: dict[type, dict[str, Any]] = {  # each config with only what it requires
    BuildConfig: {"input": "i", "output": "o", "tokenizer": "t"},
    TokenizeConfig: {"inputs": ["i"], "output": "o", "tokenizer": "t"},
    MergeConfig: {"input": "i", "output": "o", "save_filename": "m"},
    ContextShuffleConfig: {"input": "i", "output": "o", "context_window": 8},
    CountConfig: {"inputs": ["i"], "tokenizer": "t"},
}
TEXT_OPTIONS = {"eos_token", "id_key", "loss_fields", "loss_roles", "messages_key", "pad_token", "save_filename"}
TEXT_OPTIONS |= {"template", "text_key"}


def options_of(test) -> list[tuple[type, str]]:
    """Every ``(config, field name)`` for which ``test(kind)`` holds."""
    return [(stage, f.name) for stage in MINIMAL for f, _, kind in fields_of(stage) if test(kind)]


def commands() -> dict[str, argparse.ArgumentParser]:
    (sub,) = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(sub.choices)


@pytest.mark.parametrize("name", sorted(commands()))
def test_every_option_of_every_command_has_help(name: str) -> None:
    missing = [a.dest for a in commands()[name]._actions if not a.help]
    assert missing == []


def test_help_states_the_defaults_users_ask_about() -> None:
    tokenize = commands()["tokenize"].format_help()
    assert "default: the tokenizer's own end-of-text token" in " ".join(tokenize.split())
    assert "(default: 1,000; unlimited for no limit)" in " ".join(tokenize.split())
    merge = " ".join(commands()["merge"].format_help().split())
    assert (
        "--merge-max-tokens-per-file INT close a merged file once it holds this many tokens, at the end of a "
        "document or chunk (default: 100,000,000,000)" in merge
    )
    top = build_parser().format_help()
    assert "X.ds.index the\nuint64 end offset" in top and "tokenization build data/ --output builds/" in top


def test_the_command_line_makes_the_same_config_as_the_library() -> None:
    args = build_parser().parse_args(
        [
            "tokenize",
            "a",
            "b",
            "--output",
            "o",
            "--tokenizer",
            "t",
            "--no-shuffle",
            "--format",
            "megatron",
            "--max-rejects",
            "unlimited",
            "--special-tokens-in-text",
            "special",
        ]
    )
    from tokenization.options import from_arguments

    config = from_arguments(TokenizeConfig, args)
    assert config == TokenizeConfig(
        inputs=["a", "b"],
        output="o",
        tokenizer="t",
        shuffle_documents=False,
        output_format="megatron",
        max_rejects=None,
        special_text="special",
    )


def test_paths_are_taken_for_their_strings(tmp_path) -> None:
    config = TokenizeConfig(inputs=[tmp_path / "a", "b"], output=tmp_path, tokenizer=tmp_path / "t.json")
    assert (config.inputs, config.output, config.tokenizer) == (
        [f"{tmp_path}/a", "b"],
        str(tmp_path),
        f"{tmp_path}/t.json",
    )


def test_configs_check_themselves_naming_the_field() -> None:
    with pytest.raises(UsageError, match="num_ranks must be at most 4096, got 5000"):
        BuildConfig(input="i", output="o", tokenizer="t", num_ranks=5000)
    with pytest.raises(UsageError, match="merge_mode must be one of interleave, shuffle, bucketed, got 'random'"):
        MergeConfig(input="i", output="o", save_filename="m", merge_mode="random")  # type: ignore[arg-type]
    with pytest.raises(UsageError, match="num_ranks must be an integer, got '4'"):
        BuildConfig(input="i", output="o", tokenizer="t", num_ranks="4")  # type: ignore[arg-type]
    with pytest.raises(UsageError, match="save_loss must be true or false, got 1"):
        BuildConfig(input="i", output="o", tokenizer="t", save_loss=1)  # type: ignore[arg-type]
    with pytest.raises(UsageError, match="save_filename must not be empty"):
        MergeConfig(input="i", output="o", save_filename="")
    with pytest.raises(UsageError, match="Megatron's indexed dataset has no loss mask"):
        BuildConfig(input="i", output="o", tokenizer="t", output_format="megatron", save_loss=True)


def test_every_build_param_has_a_title_a_description_and_a_schema() -> None:
    offered = [(f, spec, kind) for f, spec, kind in fields_of(BuildConfig) if spec.param]
    assert len(offered) >= 20
    for f, spec, _ in offered:
        assert spec.title and spec.help, f.name
    schemas = {f.name: json_schema(f, spec, kind) for f, spec, kind in offered}
    assert schemas["num_ranks"] == {"type": "integer", "minimum": 1, "maximum": 4096}
    assert schemas["seed"] == {"type": ["null", "integer"], "minimum": 0, "maximum": 2**63 - 1}
    assert schemas["merge_mode"] == {"enum": ["interleave", "shuffle", "bucketed"]}
    assert schemas["input"] == {"type": ["null", "string"], "minLength": 1}  # a mixture's sources name their own
    assert schemas["mixture"]["type"] == ["null", "object"] and schemas["mixture"]["required"] == ["sources"]
    assert "storage_options" not in schemas and "local_working_dir" not in schemas


@pytest.mark.parametrize(
    ("stage", "groups"),
    [
        (TokenizeConfig, (DocumentOptions, RankOptions)),
        (MergeConfig, (MergeOptions,)),
        (ContextShuffleConfig, (ContextOptions,)),
    ],
)
def test_an_option_a_build_passes_to_a_stage_is_one_definition(stage: type, groups: tuple[type, ...]) -> None:
    """The build hands each stage its option groups whole: one name, default, help and bound for both."""
    shared = {f.name for f, _, _ in fields_of(stage) if section(stage, f.name)}
    assert shared == {f.name for group in groups for f, _, _ in fields_of(group)}
    ours = {f.name: (f.default, spec) for f, spec, _ in fields_of(BuildConfig)}
    assert all(
        ours[f.name] == (f.default, spec) and section(BuildConfig, f.name)
        for f, spec, _ in fields_of(stage)
        if f.name in shared
    )


def test_a_context_shuffle_needs_a_window() -> None:
    with pytest.raises(UsageError, match="context_window must be at least 1: a build skips the context shuffle"):
        ContextShuffleConfig(input="i", output="o", context_window=0)


@pytest.mark.parametrize(("stage", "name"), options_of(lambda kind: kind.base is int))
def test_every_integer_option_fits_64_bits(stage: type, name: str) -> None:
    """Issue 37: --seed of 71 digits ran every stage, then the manifest could not hold it (TypeError: Integer exceeds
    64-bit range). No integer option takes more than a signed 64-bit integer holds."""
    with pytest.raises(UsageError, match=rf"^{name} must be at most \d+, got {10**70}$"):
        stage(**MINIMAL[stage] | {name: 10**70})


@pytest.mark.parametrize("stage", [BuildConfig, TokenizeConfig, MergeConfig, ContextShuffleConfig])
def test_every_seed_goes_up_to_the_largest_signed_64_bit_integer(stage: type) -> None:
    assert stage(**MINIMAL[stage], seed=2**63 - 1).seed == 2**63 - 1
    with pytest.raises(UsageError, match=rf"^seed must be at most 9223372036854775807, got {2**63}$"):
        stage(**MINIMAL[stage], seed=2**63)


FLOATS = options_of(lambda kind: kind.base is float)
STRINGS = options_of(lambda kind: kind.base in (str, list) and not kind.choices)


@pytest.mark.parametrize(("stage", "name"), FLOATS)
@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_no_number_option_takes_nan_or_infinity(stage: type, name: str, value: float) -> None:
    """Issue 37: --max-reject-fraction nan passed every bound and turned the limit off (a file of 50% bad records
    passed). No number option means anything by infinity: an optional one says "no limit" with none."""
    with pytest.raises(UsageError, match=rf"^{name} must be a finite number, got {value}$"):
        stage(**MINIMAL[stage] | {name: value})


def test_every_string_option_is_a_location_or_text() -> None:
    """A new string option is one or the other: a location is checked for a malformed URL (``LOCATIONS``)."""
    assert {name for _, name in STRINGS} == LOCATIONS | TEXT_OPTIONS
    assert FLOATS  # and the test of number options above tests something


@pytest.mark.parametrize(("stage", "name"), [(stage, name) for stage, name in STRINGS if name in LOCATIONS])
def test_every_location_refuses_a_url_missing_a_slash(stage: type, name: str) -> None:
    """Issue 37: --output s3:/b/x wrote to a local folder named s3:."""
    with pytest.raises(UsageError) as refused:
        stage(**MINIMAL[stage] | {name: ["s3:/b/x"] if name == "inputs" else "s3:/b/x"})
    assert str(refused.value) == (
        f"{name} 's3:/b/x' is no URL, a scheme being followed by '://' (fsspec would take it for a local path): "
        "write s3://b/x, or ./s3:/b/x for a local path"
    )
