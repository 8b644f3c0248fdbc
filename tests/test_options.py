"""Every option is declared once, on a stage config: the command line and the DAG's Params are made from it."""

from __future__ import annotations

import argparse

import pytest

from tokenization.builds.config import BuildConfig
from tokenization.cli import build_parser
from tokenization.io.errors import UsageError
from tokenization.io.options import fields_of, json_schema, section
from tokenization.stages.context_shuffle import ContextOptions, ContextShuffleConfig
from tokenization.stages.merge import MergeConfig, MergeOptions
from tokenization.stages.tokenize import RankOptions, TokenizeConfig
from tokenization.text.documents import DocumentOptions


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
    from tokenization.io.options import from_arguments

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
        MergeConfig(input="i", output="o", save_filename="m", merge_mode="random")
    with pytest.raises(UsageError, match="num_ranks must be an integer, got '4'"):
        BuildConfig(input="i", output="o", tokenizer="t", num_ranks="4")
    with pytest.raises(UsageError, match="save_loss must be true or false, got 1"):
        BuildConfig(input="i", output="o", tokenizer="t", save_loss=1)
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
    assert schemas["seed"] == {"type": ["null", "integer"], "minimum": 0}
    assert schemas["merge_mode"] == {"enum": ["interleave", "shuffle", "bucketed"]}
    assert schemas["input"] == {"type": "string", "minLength": 1}
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
