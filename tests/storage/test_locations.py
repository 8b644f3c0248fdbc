"""Allowed locations: builds read and write only inside the deployment's prefixes, never over http(s)."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import pytest

from tokenization.inputs.formats import InputError
from tokenization.inputs.listing import list_input_files
from tokenization.storage.locations import (
    AllowedLocations,
    LocationError,
    check_disjoint,
    intended_url,
    tokenizer_files,
)


@pytest.fixture
def allowed(tmp_path) -> AllowedLocations:
    return AllowedLocations.parse(f"{tmp_path}/builds, s3://corpus/builds\n s3://corpus/clean")


@pytest.mark.parametrize(
    ("location", "ok"),
    [
        ("{tmp}/builds", True),
        ("{tmp}/builds/nightly/run", True),
        ("file://{tmp}/builds/x", True),
        ("{tmp}/builds/../secrets", False),
        ("{tmp}/buildsX", False),
        ("/etc", False),
        ("../../", False),
        ("s3://corpus/builds/2026", True),
        ("s3://corpus/builds/../private", False),
        ("s3://corpus/../other-bucket", False),
        ("s3://corpus/clean/*.jsonl.gz", True),
        ("s3://corpus", False),
        ("http://127.0.0.1:8765/secret/index.html?x=", False),
        ("https://corpus/builds", False),
        ("memory://corpus/builds", False),
    ],
)
def test_only_locations_inside_a_prefix_are_allowed(allowed, tmp_path, location, ok) -> None:
    assert allowed.allows(location.format(tmp=tmp_path)) is ok


@pytest.mark.parametrize(
    ("location", "meant"),
    [
        ("s3:/b/x", "s3://b/x"),
        ("s3:b/x", "s3://b/x"),
        ("S3:/b", "s3://b"),
        ("gs:/", "gs://"),
        ("file:/data/x", "file:///data/x"),  # fsspec reads /data/x; resolve() and the allowed prefixes, ./file:/data/x
        ("s3://b/x", None),
        ("file:///data/x", None),
        ("/data/x", None),
        ("data/x", None),
        ("qa:col/x", None),  # no storage is named qa: a local folder, qa:col
        ("c:/x", None),
        ("data:text/plain,x", None),  # fsspec's data URLs hold no slashes
    ],
)
def test_a_url_missing_a_slash_is_told_from_a_path(location: str, meant: str | None) -> None:
    """Issue 37: --output s3:/b/x, with one slash, wrote to a local folder named s3:."""
    assert intended_url(location) == meant


def test_a_symlink_out_of_a_prefix_is_not_inside_it(allowed, tmp_path) -> None:
    (tmp_path / "builds").mkdir()
    (tmp_path / "builds" / "escape").symlink_to("/etc")
    assert not allowed.allows(f"{tmp_path}/builds/escape/passwd")


def test_refusals_name_the_param_and_the_setting(allowed) -> None:
    with pytest.raises(LocationError, match=r"^param output: http://x/y: http:// is not a storage"):
        allowed.check("output", "http://x/y")
    with pytest.raises(LocationError, match=r"^param input: /etc/passwd is outside .*TOKENIZATION_ALLOWED_LOCATIONS"):
        allowed.check("input", "/etc/passwd")
    allowed.check("output", "s3://corpus/builds")


def write(path: Path, data: str = '{"text": "a"}\n') -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(data)
    return path


def test_a_symlinked_file_in_an_allowed_folder_is_checked_where_it_leads(allowed, tmp_path) -> None:
    """Finding 11: the folder was allowed, so its files were read, though one led to 50 secret documents."""
    builds = tmp_path / "builds"
    secret = write(tmp_path / "secret" / "leak.jsonl")
    write(builds / "a.jsonl")
    for name in ("leak.jsonl", "nested/leak2.jsonl"):  # two links to one file would be one input file
        (builds / name).parent.mkdir(parents=True, exist_ok=True)
        (builds / name).symlink_to(write(tmp_path / "secret" / Path(name).name))
    urls = [f.url for f in list_input_files([str(builds)]).files]
    assert len(urls) == 3 and allowed.allows(str(builds))
    with pytest.raises(LocationError) as refused:
        allowed.check_files("input", urls)
    assert str(refused.value) == (
        f"param input: {builds}/leak.jsonl resolves to {secret}, outside the locations this deployment allows "
        f"({', '.join(allowed.prefixes)}; the deployment setting TOKENIZATION_ALLOWED_LOCATIONS lists them); 1 more "
        "of its files are too: remove the links, or allow where they lead"
    )
    allowed.check_files("input", [str(builds / "a.jsonl"), "s3://corpus/clean/x.jsonl"])


def test_a_tokenizer_folder_is_checked_file_by_file(allowed, tmp_path) -> None:
    folder, secret = tmp_path / "builds" / "tok", write(tmp_path / "secret.json", "{}")
    folder.mkdir(parents=True)
    assert tokenizer_files(str(folder)) == [
        f"{folder}/tokenizer.json",
        f"{folder}/tokenizer.model",  # the folder's tokenizer when it holds no tokenizer.json
        f"{folder}/tokenizer_config.json",
    ]
    assert tokenizer_files(f"{folder}/tokenizer.json") == [
        f"{folder}/tokenizer.json",
        f"{folder}/tokenizer_config.json",
    ]
    assert tokenizer_files("s3://corpus/tok/") == ["s3://corpus/tok/"]
    allowed.check_files("tokenizer", tokenizer_files(str(folder)))  # missing files stay where they would be
    (folder / "tokenizer_config.json").symlink_to(secret)
    with pytest.raises(LocationError, match=rf"^param tokenizer: {folder}/tokenizer_config.json resolves to {secret},"):
        allowed.check_files("tokenizer", tokenizer_files(str(folder)))
    (folder / "tokenizer.model").symlink_to(secret)
    with pytest.raises(LocationError, match=rf"^param tokenizer: {folder}/tokenizer.model resolves to {secret},"):
        allowed.check_files("tokenizer", tokenizer_files(str(folder)))


@pytest.mark.parametrize(
    ("inputs", "output", "relation"),
    [
        (["{tmp}/in"], "{tmp}/in/", "is"),
        (["{tmp}/in/"], "{tmp}/in/builds", "is inside"),
        (["{tmp}/in/2026/clean"], "{tmp}/in", "contains"),
        (["{tmp}/a.jsonl", "{tmp}/in/*.jsonl.gz"], "{tmp}/in/nightly", "is inside"),
        (["{tmp}/in/a.jsonl"], "file://{tmp}/in", "contains"),
        (["{tmp}/in"], "{tmp}/link/out", "is inside"),
        (["s3://corpus/clean"], "s3://corpus/clean/./tokens", "is inside"),
        (["s3://corpus/clean/*/part-*.parquet"], "s3://corpus/x/../clean/tokens", "is inside"),
        (["s3://corpus/clean/2026"], "s3://corpus", "contains"),
    ],
)
def test_an_output_overlapping_an_input_is_refused(tmp_path, inputs, output, relation) -> None:
    """Finding 11: a build whose output sits in its input feeds the next build its own manifests as documents."""
    (tmp_path / "in").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "in")
    inputs, output = [i.format(tmp=tmp_path) for i in inputs], output.format(tmp=tmp_path)
    with pytest.raises(LocationError, match=rf"^output {re.escape(output)} .*{relation} input ") as refused:
        check_disjoint(inputs, output)
    assert str(refused.value).endswith(
        ": a build on that input would read this build's own files as documents; choose an output outside every input"
    )


def test_messages_show_where_a_link_or_a_glob_leads(tmp_path) -> None:
    (tmp_path / "in").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "in")
    with pytest.raises(LocationError) as refused:
        check_disjoint([f"{tmp_path}/in/*.jsonl"], f"{tmp_path}/link/out")
    assert str(refused.value).startswith(
        f"output {tmp_path}/link/out ({tmp_path}/in/out) is inside input {tmp_path}/in/*.jsonl ({tmp_path}/in): "
    )


@pytest.mark.parametrize(
    ("inputs", "output"),
    [
        (["{tmp}/in"], "{tmp}/in-builds"),
        (["{tmp}/in/a.jsonl", "{tmp}/corpus/*.jsonl"], "{tmp}/builds"),
        (["s3://corpus/clean"], "s3://corpus/cleaned"),
        (["s3://corpus/clean"], "{tmp}/in"),
        (["memory://corpus/clean"], "memory://corpus/tokens"),
    ],
)
def test_outputs_beside_their_inputs_are_fine(tmp_path, inputs, output) -> None:
    check_disjoint([i.format(tmp=tmp_path) for i in inputs], output.format(tmp=tmp_path))


def test_names_starting_with_an_underscore_are_ignored_at_every_depth_and_counted(tmp_path) -> None:
    """Finding 11: a build written inside its input folder left out/_manifests/*.json, read back as input."""
    corpus = tmp_path / "_private" / "corpus"  # the folder named may start with _: only names below it count
    write(corpus / "a.jsonl")
    write(corpus / "2026" / "b.jsonl")
    for hidden in ("out/_manifests/rank.json", "out/_completions/00000.json", "2026/.cache/c.jsonl", "_tmp.jsonl"):
        write(corpus / hidden, "{}\n")
    listing = list_input_files([str(corpus)])
    assert [f.url for f in listing.files] == [f"{corpus}/2026/b.jsonl", f"{corpus}/a.jsonl"]
    assert listing.hidden == 4 and listing.skipped == []
    globbed = list_input_files([f"{corpus}/*/*.json*", f"{corpus}/out/*/*.json"])
    assert [f.url for f in globbed.files] == [f"{corpus}/2026/b.jsonl"] and globbed.hidden == 2
    assert list_input_files([str(corpus / "out" / "_manifests" / "rank.json")]).hidden == 0  # a file named is read


def test_a_folder_of_hidden_files_only_says_so(tmp_path) -> None:
    write(tmp_path / "in" / "_manifests" / "rank.json")
    with pytest.raises(
        InputError, match=r"no input files found in .*/in \(1 ignored under names starting with \. or _\)$"
    ):
        list_input_files([str(tmp_path / "in")])


def test_a_file_name_that_is_not_utf8_is_refused_at_listing(tmp_path) -> None:
    """Finding 8: the rank encoded everything, then died recording the name in its manifest."""
    write(tmp_path / "in" / "a.jsonl")
    os.close(os.open(os.fsencode(tmp_path / "in") + b"/bad\xff.jsonl", os.O_CREAT | os.O_WRONLY))
    with pytest.raises(InputError) as refused:
        list_input_files([str(tmp_path / "in")])
    assert str(refused.value) == f"{tmp_path}/in/bad\\xff.jsonl: the file name is not valid UTF-8; rename it"
    os.close(os.open(os.fsencode(tmp_path / "in") + b"/notes\xfe.txt", os.O_CREAT | os.O_WRONLY))
    os.remove(os.fsencode(tmp_path / "in") + b"/bad\xff.jsonl")
    with pytest.raises(InputError, match=r"/in/notes\\xfe\.txt: the file name is not valid UTF-8"):
        list_input_files([str(tmp_path / "in")])  # a skipped file is named in the manifest too
    os.remove(os.fsencode(tmp_path / "in") + b"/notes\xfe.txt")
    os.close(os.open(os.fsencode(tmp_path / "in") + b"/_old\xff.jsonl", os.O_CREAT | os.O_WRONLY))
    assert list_input_files([str(tmp_path / "in")]).hidden == 1  # never read, never named


def test_a_cache_inside_an_input_is_refused_in_its_own_words(tmp_path) -> None:
    """Issue 51: "choose an cache"."""
    with pytest.raises(LocationError) as refused:
        check_disjoint([str(tmp_path / "in")], str(tmp_path / "in" / ".cache"), "cache")
    assert str(refused.value) == (
        f"cache {tmp_path}/in/.cache is inside input {tmp_path}/in: a build on that input would read this build's "
        "own files as documents; choose a cache outside every input"
    )


def test_tokenization_build_refuses_an_output_inside_its_input(tmp_path, sample_tokenizer) -> None:
    """The next build on that input would read this one's _manifests/*.json as documents and fail on rejects."""
    from tests.support.processes import cli

    write(tmp_path / "in" / "a.jsonl")
    done = cli(
        "build", str(tmp_path / "in"), "--output", str(tmp_path / "in" / "builds"), "--tokenizer", str(sample_tokenizer)
    )
    assert done.returncode == 1 and not (tmp_path / "in" / "builds").exists()
    assert done.stderr.splitlines()[-1] == (
        f"error: output {tmp_path}/in/builds is inside input {tmp_path}/in: a build on that input would read this "
        "build's own files as documents; choose an output outside every input"
    )


def test_an_input_folder_named_like_a_glob_is_taken_literally(tmp_path, sample_corpus) -> None:
    """``data [v2]`` exists: it is that folder, not a pattern that matches ``data v``, and an output beside it is
    apart from it."""
    folder = tmp_path / "data [v2]"
    shutil.copytree(sample_corpus, folder)
    (tmp_path / "data v").mkdir()
    (tmp_path / "data v" / "x.jsonl").write_text('{"text": "not an input"}\n')
    listed = list_input_files([str(folder)])
    assert [f.url for f in listed.files] == sorted(str(p) for p in folder.glob("*.jsonl.gz"))
    check_disjoint([str(folder)], str(tmp_path / "builds"))
