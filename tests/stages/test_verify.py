"""verify passes on every output the pipeline makes and names the file of each kind of damage."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest

from tests.support.checksums import as_sha256_records, digest_of, resum
from tests.support.corpus import write_jsonl
from tests.support.stages import merged, run, shuffled
from tests.support.tokenizers import EOS
from tokenization.cli import main
from tokenization.formats import moves
from tokenization.stages.verify import verify
from tokenization.storage.checksums import SHA256
from tokenization.storage.folder import Folder

NAME = "00000_00000_doc_shuffled.ds"


@pytest.fixture
def rank(tmp_path, sample_corpus, sample_tokenizer):
    run([sample_corpus], tmp_path / "out", sample_tokenizer, seed=2, save_loss=True)
    return tmp_path / "out"


def check(folder, sample_tokenizer):
    return verify(Folder(str(folder)), str(sample_tokenizer), EOS)


def test_every_pipeline_output_passes(tmp_path, sample_corpus, sample_tokenizer) -> None:
    outputs: dict[str, dict[str, Any]] = {
        "doc": {"save_loss": True},
        "chunk": {"shuffle_chunk_size": 333, "save_loss": True, "max_tokens_per_file": 20_000},
        "plain": {"shuffle_documents": False, "max_tokens_per_file": 9000},
        "megatron": {"output_format": "megatron"},
    }
    for name, options in outputs.items():
        for r in range(2):
            run([sample_corpus], tmp_path / name, sample_tokenizer, rank=r, world_size=2, **options)
    merged(tmp_path / "doc", tmp_path / "merged", seed=1, save_loss=True, merge_max_tokens_per_file=15_000)
    chunks = {"shuffle_chunk_size": 400, "merge_max_tokens_per_file": 15_000}
    merged(tmp_path / "doc", tmp_path / "merged_chunks", seed=1, **chunks)
    shuffled(tmp_path / "merged", tmp_path / "context", context_window=1025)
    shuffled(tmp_path / "merged_chunks", tmp_path / "context_of_chunks", context_window=1025)
    for folder in sorted(tmp_path.iterdir()):
        report = check(folder, sample_tokenizer)
        assert report.ok and report.tokens == 64522, (folder.name, report.problems)
    notes = check(tmp_path / "context_of_chunks", sample_tokenizer).notes
    assert notes and all("EOS not checked" in n for n in notes)


@pytest.mark.usefixtures("byte_path")
def test_a_missing_eos_is_found(tmp_path, sample_corpus, sample_tokenizer) -> None:
    run([sample_corpus], tmp_path, sample_tokenizer, no_eos=True)
    report = check(tmp_path, sample_tokenizer)
    assert not report.ok and f"{tmp_path}/{NAME} @ token " in report.problems[0]
    assert "document ends without EOS 0" in report.problems[0]
    assert verify(Folder(str(tmp_path)), str(sample_tokenizer)).ok  # without --eos-token that is not checked


@pytest.mark.parametrize(
    ("damage", "where", "message"),
    [
        ("truncate", NAME, "bytes of 2-byte tokens, but the index ends at token"),
        ("shuffle_index", NAME + ".index", "entry smaller than the one before"),
        ("short_loss", NAME + ".loss", "bytes for"),
        ("beyond_vocab", NAME, "id beyond the vocabulary of 4096"),
        ("token_size", NAME, "bytes of 4-byte tokens, but the index ends at token"),
        ("checksum", NAME, "differs from what _completions/00000.json records"),
    ],
)
@pytest.mark.usefixtures("byte_path")
def test_damage_is_reported_with_its_file(rank, sample_tokenizer, damage, where, message) -> None:
    path = rank / NAME
    if damage == "truncate":
        path.write_bytes(path.read_bytes()[:-10])
    elif damage == "shuffle_index":
        index = np.fromfile(f"{path}.index", dtype="<u8")
        index[[3, 4]] = index[[4, 3]]
        index.tofile(f"{path}.index")
    elif damage == "short_loss":
        loss = rank / (NAME + ".loss")
        loss.write_bytes(loss.read_bytes()[:-1])
    elif damage == "beyond_vocab":
        tokens = np.fromfile(path, dtype="<u2")
        tokens[100] = 5000
        tokens.tofile(path)
    elif damage == "token_size":
        meta = rank / (NAME + ".metadata")
        meta.write_text(meta.read_text().replace("|2\n", "|4\n"))
    elif damage == "checksum":
        tokens = np.fromfile(path, dtype="<u2")
        tokens[[10, 11]] = tokens[[11, 10]] if tokens[10] != tokens[11] else (tokens[[10, 11]] + 1) % 4000
        tokens.tofile(path)
    report = check(rank, sample_tokenizer)
    assert not report.ok
    assert any(p.startswith(f"{rank}/{where}") and message in p for p in report.problems), report.problems
    assert main(["verify", str(rank), "--tokenizer", str(sample_tokenizer), "--eos-token", EOS]) == 1


def test_damaged_megatron_index_is_reported(tmp_path, sample_corpus, sample_tokenizer) -> None:
    run([sample_corpus], tmp_path, sample_tokenizer, output_format="megatron")
    idx = tmp_path / "00000_00000_doc_shuffled.idx"
    data = bytearray(idx.read_bytes())
    data[40:44] = (10**6).to_bytes(4, "little")  # the second sequence length
    idx.write_bytes(bytes(data))
    problems = check(tmp_path, sample_tokenizer).problems
    assert any(p.startswith(f"{tmp_path}/00000_00000_doc_shuffled.bin: ") and "lengths add up" in p for p in problems)
    assert any("byte pointer disagrees" in p for p in problems)


def test_a_deleted_family_is_reported(tmp_path, sample_corpus, sample_tokenizer) -> None:
    """Finding 3: deleting a whole family that the manifest lists passed."""
    run([sample_corpus], tmp_path, sample_tokenizer, max_tokens_per_file=20_000)
    gone = "00000_00001_doc_shuffled.ds"
    for path in tmp_path.glob(f"{gone}*"):
        path.unlink()
    report = check(tmp_path, sample_tokenizer)
    assert f"{tmp_path}/{gone}: listed in the tokenize manifest but missing" in report.problems
    assert main(["verify", str(tmp_path)]) == 1


def test_an_unlisted_family_is_reported(tmp_path, rank, sample_corpus, sample_tokenizer) -> None:
    run([sample_corpus], tmp_path / "other", sample_tokenizer, seed=3, save_filename="extra", save_loss=True)
    for path in (tmp_path / "other").glob("extra_*.ds*"):
        path.rename(rank / path.name)
    report = check(rank, sample_tokenizer)
    assert report.problems == [
        f"{rank}/extra_00000_00000_doc_shuffled.ds: no manifest lists this file family: a leftover of another run, "
        "or the output of a stage that did not finish"
    ]


def test_manifest_counts_and_markers_are_checked(rank, sample_tokenizer) -> None:
    path = rank / "_manifests" / "00000.json"
    record = json.loads(path.read_text())
    record["outputs"][0]["tokens"] += 1
    record["outputs"][0]["index_entries"] -= 1
    path.write_text(json.dumps(record))
    problems = check(rank, sample_tokenizer).problems
    tokens = record["outputs"][0]["tokens"] - 1
    assert f"{rank}/{NAME}: holds {tokens} tokens, its manifest says {tokens + 1}" in problems
    assert any(p.startswith(f"{rank}/{NAME}: its index holds ") for p in problems)
    assert f"{rank}/_manifests/00000.json: counts {tokens} tokens written, its outputs list {tokens + 1}" in problems
    assert f"{rank}/_manifests/00000.json: differs from the checksum its completion marker records" in problems
    (rank / "_completions" / "00000.json").unlink()
    assert f"{rank}/_manifests/00000.json: has no completion marker: its stage did not finish" in (
        check(rank, sample_tokenizer).problems
    )


def test_verify_asks_storage_no_size_and_no_existence_a_file(rank, sample_tokenizer, storage_questions) -> None:
    """publish verifies a whole dataset: the folder's one listing answers every size and existence question."""
    report = check(rank, sample_tokenizer)
    assert report.ok and report.files == 1 and not storage_questions, storage_questions


@pytest.fixture(scope="module")
def built(tmp_path_factory, sample_corpus, sample_tokenizer) -> Path:
    """One small build (2 ranks, a merge into 4 files, 2 context shards) for the module, which keeps its
    intermediate token files (the tests check every stage folder); tests damage copies."""
    from tokenization.builds.config import BuildConfig
    from tokenization.builds.run import Build

    config = BuildConfig(
        input=str(sample_corpus),
        output=str(tmp_path_factory.mktemp("builds")),
        tokenizer=str(sample_tokenizer),
        seed=7,
        num_ranks=2,
        save_loss=True,
        context_window=1025,
        num_context_shards=2,
        merge_max_tokens_per_file=20_000,
        keep_intermediate=True,
    )
    assert Build.start(config, "b").run(parallel=1).record.verify.ok
    return Path(config.output) / "b"


@pytest.fixture
def run_dir(built, tmp_path) -> Path:
    return Path(shutil.copytree(built, tmp_path / "b"))


def problems(folder: Path) -> list[str]:
    return verify(Folder(str(folder))).problems


def verify_cli(capsys, folder: Path) -> tuple[int, list[str]]:
    """Exit status and stdout lines of ``tokenization verify``; nothing may reach stderr (no traceback)."""
    status = main(["verify", str(folder)])
    out, err = capsys.readouterr()
    assert err == ""
    return status, out.splitlines()


def other_digit(digest: str) -> str:
    return ("1" if digest[0] != "1" else "2") + digest[1:]


def test_every_stage_folder_of_a_build_passes(built) -> None:
    for stage in ("ranks", "merged", "context"):
        assert verify(Folder(str(built / stage))).ok, stage


@pytest.mark.parametrize(("stage", "stem"), [("ranks", "00001"), ("merged", "corpus"), ("context", "context_00000")])
@pytest.mark.parametrize("field", ["bytes", "blake3"])
def test_a_changed_digit_in_a_marker_file_list_is_reported(run_dir, stage, stem, field) -> None:
    """Finding 3: a digit changed in a completion marker's file list (a size or a checksum) passed, in any stage."""
    folder = run_dir / stage
    path = folder / "_completions" / f"{stem}.json"
    marker = json.loads(path.read_text())
    name = sorted(marker["files"])[0]  # the .ds itself, hashed while its tokens stream
    real = marker["files"][name]
    said = real | {field: real["bytes"] + 1 if field == "bytes" else other_digit(real["blake3"])}
    marker["files"][name] = said
    path.write_text(json.dumps(marker))
    expected = (
        f"{folder}/{name}: differs from what _completions/{stem}.json records ({real['bytes']} bytes, blake3 "
        f"{real['blake3'][:12]}…, not {said['bytes']} bytes, {said['blake3'][:12]}…)"
    )
    assert problems(folder) == [expected]


def test_a_build_published_with_sha256_records_verifies_with_its_digest(run_dir, capsys, sample_tokenizer) -> None:
    """Issue 53: a build published before BLAKE3, its records giving sha256 and its digest made of them, passes
    ``verify RUN_DIR``; a byte flipped in its dataset is caught, named with sha256."""
    for stage in ("ranks", "merged", "context"):
        as_sha256_records(run_dir / stage)
    record = json.loads((run_dir / "_BUILD.json").read_text())
    record["digest"] = digest_of(run_dir / "context", sample_tokenizer, SHA256)
    (run_dir / "_BUILD.json").write_text(json.dumps(record, indent=2))
    status, lines = verify_cli(capsys, run_dir)
    assert status == 0, lines
    path = sorted((run_dir / "context").glob("*.ds.loss"))[0]
    data = bytearray(path.read_bytes())
    data[7] ^= 1
    path.write_bytes(bytes(data))
    status, lines = verify_cli(capsys, run_dir)
    assert status == 1 and any(line.startswith(f"{path}: differs from what") and " sha256 " in line for line in lines)


@pytest.mark.parametrize("damage", ["edit", "truncate", "delete"])
def test_the_dataset_metadata_is_checked(run_dir, damage) -> None:
    """Finding 3: ``merged/corpus.ds.metadata`` edited, truncated or deleted passed."""
    folder = run_dir / "merged"
    path = folder / "corpus.ds.metadata"
    text = path.read_text()
    if damage == "delete":
        path.unlink()
        assert problems(folder) == [f"{path}: listed by _completions/corpus.json but missing"]
        return
    path.write_text(text.replace("sample", "samples") if damage == "edit" else text[: text.rindex("\n") + 1])
    (problem,) = problems(folder)
    assert problem.startswith(f"{path}: differs from what _completions/corpus.json records ({path.stat().st_size} ")


@pytest.mark.parametrize("damage", ["flip", "delete"])
def test_a_damaged_merge_checkpoint_is_reported(run_dir, damage) -> None:
    """Finding 3: a merge checkpoint (where a resumed merge starts) flipped or deleted passed."""
    folder = run_dir / "merged"
    path = folder / "_manifests" / "001_corpus.json"
    what = "the checkpoint of 001_corpus.ds, which _manifests/corpus.json lists"
    if damage == "delete":
        path.unlink()
        expected = f"missing: {what} (a resumed merge would redo that file and every later one)"
    else:
        path.write_text(path.read_text().replace('"units_end": ', '"units_end": 1'))
        expected = f"differs from {what}: a resumed merge would start from it"
    assert problems(folder) == [f"{path}: {expected}"]


def test_a_resumed_merge_passes(run_dir, monkeypatch) -> None:
    """The checkpoints of a merge that crashed and resumed are its manifest's entries; the crashed one's folder
    is not a dataset."""
    out = run_dir / "again"
    options = {"save_filename": "corpus", "seed": 7, "merge_max_tokens_per_file": 20_000, "save_loss": True}
    real_finish, calls = moves.SplitWriter._finish, []

    def crash_on_the_third_file(self) -> None:
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("simulated crash")
        real_finish(self)

    monkeypatch.setattr(moves.SplitWriter, "_finish", crash_on_the_third_file)
    with pytest.raises(RuntimeError, match="simulated crash"):
        merged(run_dir / "ranks", out, **options)
    monkeypatch.undo()
    assert problems(out)[0] == (
        f"{out}: no stage manifest in _manifests/: the stage that writes this folder did not finish, or its "
        "manifest was removed; run that stage again"
    )
    assert merged(run_dir / "ranks", out, **options)["counts"]["resumed_files"] == 2
    assert verify(Folder(str(out))).ok


@pytest.mark.parametrize(
    ("stray", "message"),
    [
        (
            "old.json",
            "no stage manifest _manifests/old.json: a marker copied from elsewhere, or its manifest was removed",
        ),
        ("notes.txt", "not a record: only _completions/{stem}.json files belong there; remove it"),
    ],
)
def test_a_stray_marker_is_refused(run_dir, stray, message) -> None:
    """Finding 3: a stray marker added to ``_completions/`` passed."""
    folder = run_dir / "merged"
    shutil.copy(folder / "_completions" / "corpus.json", folder / "_completions" / stray)
    assert problems(folder) == [f"{folder}/_completions/{stray}: {message}"]


def test_a_marker_must_list_what_its_manifest_lists(run_dir) -> None:
    folder = run_dir / "ranks"
    path = folder / "_completions" / "00000.json"
    marker = json.loads(path.read_text())
    del marker["files"][NAME + ".loss"]
    path.write_text(json.dumps(marker | {"manifest": "_manifests/00001.json"}))
    assert problems(folder) == [
        f"{path}: names the manifest _manifests/00001.json, not its own _manifests/00000.json",
        f"{folder}/{NAME}.loss: its manifest _manifests/00000.json lists it, its completion marker does not",
    ]


@pytest.mark.parametrize("stray", ["004_corpus.ds.index", "000_corpus.ds.extra", "corpus.ds.loss"])
def test_a_lone_family_file_is_refused(run_dir, stray) -> None:
    """Finding 3: a stray lone ``.ds.index`` added passed."""
    folder = run_dir / "merged"
    shutil.copy(folder / "000_corpus.ds.index", folder / stray)
    assert problems(folder) == [
        f"{folder}/{stray}: no completion marker lists this file: a leftover of another run, or of a stage that "
        "did not finish; remove it"
    ]


def test_a_stage_folder_without_its_manifest_is_an_error(run_dir, tmp_path, capsys) -> None:
    """Finding 3: with the stage manifest deleted, verify printed a note and passed."""
    merged_dir = run_dir / "merged"
    (merged_dir / "_manifests" / "corpus.json").unlink()
    found = problems(merged_dir)
    assert found[:2] == [
        f"{merged_dir}: no stage manifest in _manifests/: the stage that writes this folder did not finish, or its "
        "manifest was removed; run that stage again",
        f"{merged_dir}/_completions/corpus.json: no stage manifest _manifests/corpus.json: a marker copied from "
        "elsewhere, or its manifest was removed",
    ]
    assert (
        f"{merged_dir}/_manifests/000_corpus.json: a merge checkpoint that no stage manifest lists: a leftover of "
        "an unfinished merge" in found
    )
    assert verify_cli(capsys, merged_dir)[0] == 1
    ranks = run_dir / "ranks"
    shutil.rmtree(ranks / "_manifests")
    shutil.rmtree(ranks / "_completions")
    assert problems(ranks) == [
        f"{ranks}: no stage manifest in _manifests/: the stage that writes this folder did not finish, or its "
        "manifest was removed; run that stage again"
    ]
    plain = Path(shutil.copytree(ranks, tmp_path / "plain"))  # as datatrove writes it: no records, in no run
    report = verify(Folder(str(plain)))
    assert report.ok and report.notes == [f"{plain}: no manifests, so which files belong here cannot be checked"]


@pytest.mark.parametrize(
    ("record", "kind"), [("_manifests/corpus.json", "manifest"), ("_completions/corpus.json", "completion marker")]
)
def test_a_truncated_record_is_one_line_naming_it(run_dir, capsys, record, kind) -> None:
    """Finding 3: a truncated manifest or marker gave "unexpected end of data: line 1 column 1050", no file named."""
    folder = run_dir / "merged"
    path = folder / record
    path.write_bytes(path.read_bytes()[:1049])
    with pytest.raises(orjson.JSONDecodeError) as parsing:
        orjson.loads(path.read_bytes())
    assert verify_cli(capsys, folder) == (
        1,
        [
            f"{path}: not a valid {kind}: not JSON ({parsing.value})",
            f"{folder}: ids checked against the build's tokenizer: vocabulary 4,096, EOS id 0",
            f"verify {folder}: 4 files, 64,522 tokens: FAILED, 1 problem",
        ],
    )


def after(text: str, anchor: str, old: str, new: str) -> str:
    """``text`` with the first ``old`` after ``anchor`` replaced by ``new``."""
    at = text.index(anchor)
    assert old in text[at:]
    return text[:at] + text[at:].replace(old, new, 1)


@pytest.mark.parametrize(
    ("record", "damage", "field"),
    [
        ("_manifests/00000.json", ("outputs", '"bytes"', '"bztes"'), 'outputs[0].files["{ds}"].bytes is missing'),
        ("_completions/00000.json", ("files", '"bytes":', '"bytes":-0.'), 'files["{ds}"].bytes is -0.'),
        ("_completions/00000.json", ("", '"manifest"', '"manifesto"'), "manifest is missing"),
        ("_manifests/00000.json", ("", '"outputs": [', '"outputs": 7, "x": ['), "outputs is 7, not an array"),
    ],
)
def test_a_flipped_key_is_one_line_naming_the_file_and_field(run_dir, capsys, record, damage, field) -> None:
    """Finding 3: a one-character flip in a manifest key ("bytes" -> "bztes") gave a KeyError traceback. It is one
    line naming the file and the field, in verify and in every command that reads the record."""
    folder = run_dir / "ranks"
    path = folder / record
    path.write_text(after(path.read_text(), *damage))
    kind = "manifest" if record.startswith("_manifests") else "completion marker"
    status, lines = verify_cli(capsys, folder)
    assert status == 1 and len(lines) == 3 and lines[1].startswith(f"{folder}: ids "), lines  # checked, or why not
    assert lines[0].startswith(f"{path}: not a valid {kind}: {field.format(ds=NAME)}"), lines[0]
    assert main(["merge", str(folder), "--output", str(run_dir / "again"), "--save-filename", "x"]) == 1
    assert capsys.readouterr().err == f"error: {lines[0]}\n"


def test_the_quarantine_is_checked_against_its_marker(tmp_path, sample_tokenizer) -> None:
    corpus = write_jsonl(tmp_path / "in" / "a.jsonl", [{"text": "hello world"}, "not json", {"text": "more text"}])
    run([corpus], tmp_path / "out", sample_tokenizer, max_rejects=5, max_reject_fraction=0.9)
    quarantine = tmp_path / "out" / "_quarantine" / "00000.jsonl"
    assert verify(Folder(str(tmp_path / "out"))).ok
    quarantine.write_bytes(quarantine.read_bytes()[:-1])
    (problem,) = problems(tmp_path / "out")
    assert problem.startswith(f"{quarantine}: differs from what _completions/00000.json records ")


def test_a_run_folder_is_verified_against_its_builds_tokenizer(run_dir, capsys) -> None:
    """Issue 37, 9c: ``verify RUN_FOLDER`` without ``--tokenizer`` checked no id, so an id past the build's
    vocabulary (the file's size kept, its marker's checksum rewritten to match) passed. It is checked against the
    vocabulary and EOS the build recorded, and the output says so."""
    folder = run_dir / "context"
    said = f"{folder}: ids checked against the build's tokenizer: vocabulary 4,096, EOS id 0"
    status, lines = verify_cli(capsys, run_dir)
    assert status == 0 and said in lines, lines
    path = sorted(folder.glob("*.ds"))[0]
    tokens = np.memmap(path, dtype=np.uint16, mode="r+")
    tokens[1] = 4096
    tokens.flush()
    del tokens
    (marker,) = [p for p in (folder / "_completions").glob("*.json") if path.name in json.loads(p.read_text())["files"]]
    record = json.loads(marker.read_text())
    resum(record["files"][path.name], path.read_bytes())
    marker.write_text(json.dumps(record))
    status, lines = verify_cli(capsys, run_dir)
    assert status == 1 and f"{path} @ token 1: id beyond the vocabulary of 4096" in lines and said in lines, lines
    assert f"{path} @ token 1: id beyond the vocabulary of 4096" in problems(folder)


def test_an_eos_token_without_a_tokenizer_is_refused(built, capsys) -> None:
    """``--eos-token`` without ``--tokenizer`` was ignored without a word: no tokenizer said its id."""
    with pytest.raises(SystemExit) as exited:
        main(["verify", str(built), "--eos-token", EOS])
    assert exited.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"tokenization verify: error: --eos-token {EOS!r} needs --tokenizer, which gives its id; give neither, and a "
        "build's folders are checked against the build's own tokenizer"
    )
