"""The records as code: every record a build leaves is read back as what it was written as, and a damaged,
foreign or newer one is one line naming the file and the field, whoever reads it."""

from __future__ import annotations

import hashlib
import importlib
import json
import pkgutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import orjson
import pytest

from tests.support.paths import ROOT
from tokenization.builds.complete import Published
from tokenization.builds.config import BuildConfig
from tokenization.builds.plan import Plan
from tokenization.builds.run import Build
from tokenization.output.runs import read_build
from tokenization.records import (
    BuildRecord,
    BuildSummary,
    CacheEntry,
    CacheUse,
    CompletionMarker,
    ContextManifest,
    MergeManifest,
    MergeOutput,
    RankManifest,
    Record,
    RecordError,
    RunClaim,
    stage_manifest,
)
from tokenization.storage.folder import Folder


@pytest.fixture(scope="module")
def published(tmp_path_factory, sample_corpus, sample_tokenizer) -> Path:
    """A whole build: ranks, merge (with its checkpoints), context shards, the build record."""
    out = tmp_path_factory.mktemp("records")
    Build.start(_config(out, sample_corpus, sample_tokenizer), "records").run()
    return out / "records"


def _config(out: Path, corpus: Path, tokenizer: Path, **options) -> BuildConfig:
    return BuildConfig(
        input=str(corpus),
        output=str(out),
        tokenizer=str(tokenizer),
        num_ranks=2,
        merge_max_tokens_per_file=20_000,
        context_window=1025,
        num_context_shards=2,
        seed=5,
        **options,
    )


def _records(run: Path) -> dict[Path, type[Record]]:
    kinds: dict[Path, type[Record]] = {run / "_RUN.json": RunClaim, run / "_BUILD.json": BuildRecord}
    cache = run.parent / ".cache"
    kinds |= dict.fromkeys(sorted(cache.glob("entries/*.json")), CacheEntry)
    kinds |= dict.fromkeys(sorted(cache.glob("uses/*/*.json")), CacheUse)
    for path in sorted(run.glob("*/_completions/*.json")):
        kinds[path] = CompletionMarker
    stages: dict[str, type[Record]] = {"ranks": RankManifest, "merged": MergeManifest, "context": ContextManifest}
    for path in sorted(run.glob("*/_manifests/*.json")):
        stage = stages[path.parent.parent.name]
        kinds[path] = MergeOutput if stage is MergeManifest and path.stem != "corpus" else stage
    return kinds


def test_every_record_reads_back_as_it_was_written(published: Path) -> None:
    kinds = _records(published)
    assert {kind for kind in kinds.values()} == {
        RunClaim,
        BuildRecord,
        CompletionMarker,
        RankManifest,
        MergeManifest,
        MergeOutput,
        ContextManifest,
        CacheEntry,
        CacheUse,
    }
    for path, kind in kinds.items():
        data = path.read_bytes()
        record = kind.loads(data, str(path))
        assert record.to_json() == json.loads(data), path  # every field typed, none lost, none added
        if path.parent.name == "_manifests":
            assert stage_manifest(data, str(path)) == record  # found by its format tag alone


def _damaged(path: Path, edit) -> None:
    record = json.loads(path.read_text())
    edit(record)
    path.write_text(json.dumps(record))


@pytest.mark.parametrize(
    ("name", "kind", "edit", "message"),
    [
        (
            "ranks/_manifests/00001.json",
            RankManifest,
            lambda r: r["outputs"][0]["files"][next(iter(r["outputs"][0]["files"]))].update(bztes=1),
            r'outputs\[0\]\.files\["[^"]+"\]\.bztes is not a field of this format',
        ),
        (
            "ranks/_manifests/00001.json",
            RankManifest,
            lambda r: r["counts"].__setitem__("docs_writen", r["counts"].pop("docs_written")),
            r"counts\.docs_written is missing",
        ),
        (
            "merged/_manifests/corpus.json",
            MergeManifest,
            lambda r: r.__setitem__("format", "corpus-tokenization/merge-manifest/6"),
            r"format corpus-tokenization/merge-manifest/6 is newer than this version of corpus-tokenization reads "
            r"\(corpus-tokenization/merge-manifest/5\): upgrade to read it",
        ),
        (
            "ranks/_manifests/00001.json",
            RankManifest,
            lambda r: r["params"].__setitem__("num_buckets", "4"),
            r'params\.num_buckets is "4", not an integer',
        ),
        (
            "ranks/_manifests/00001.json",
            RankManifest,
            lambda r: r["counts"]["rejected"].__setitem__('a "b"', 1.5),
            r'counts\.rejected\["a \\"b\\""\] is 1\.5, not an integer',
        ),
        (
            "ranks/_manifests/00001.json",
            RankManifest,
            lambda r: r["outputs"][0].pop("tokens"),
            r"outputs\[0\]\.tokens is missing",
        ),
        (
            "_BUILD.json",
            BuildRecord,
            lambda r: r.__setitem__("format", "datatrove/build/1"),
            r"format \"datatrove/build/1\", not corpus-tokenization/build/N",
        ),
        (
            "_BUILD.json",
            BuildRecord,
            lambda r: r["conservation"].__setitem__("holds", "yes"),
            r'conservation\.holds is "yes", not true or false',
        ),
    ],
)
def test_a_damaged_record_is_one_line_naming_the_file_and_the_field(
    published: Path, tmp_path: Path, name: str, kind: type[Record], edit, message: str
) -> None:
    path = tmp_path / "record.json"
    path.write_bytes((published / name).read_bytes())
    _damaged(path, edit)
    with pytest.raises(RecordError, match=rf"^{path}: not a valid [a-z ]+: {message}$"):
        kind.loads(path.read_bytes(), str(path))


def test_an_older_record_is_read_with_the_fields_it_did_not_have(published: Path, tmp_path: Path) -> None:
    """build/1 and rank-manifest/1 were written before every field was kept; markers and checkpoints had no tag."""
    build = json.loads((published / "_BUILD.json").read_text())
    old = {k: v for k, v in build.items() if k not in ("plan", "inputs", "report", "token_flow")}
    record = BuildRecord.from_json(old | {"format": "corpus-tokenization/build/1", "legacy": 1}, "old")
    assert (record.plan, record.inputs, record.report, record.token_flow) == (None, None, None, {})
    assert record.conservation == BuildRecord.loads((published / "_BUILD.json").read_bytes(), "new").conservation
    rank = json.loads((published / "ranks/_manifests/00000.json").read_text())
    for key in ("loss_tokens", "length_histogram", "special_token_literals_total"):
        del rank["counts"][key]
    del rank["throughput"], rank["plan"], rank["tokenizer"]["engine"], rank["tokenizer"]["format"], rank["cache"]
    rank["format"] = "corpus-tokenization/rank-manifest/1"
    old_rank = RankManifest.from_json(rank, "old rank")
    assert old_rank.counts.loss_tokens is None and old_rank.counts.length_histogram == []
    assert old_rank.tokenizer.engine == "hf" and old_rank.throughput is None and old_rank.cache is None
    assert old_rank.tokenizer.format == "tokenizer.json"  # before other formats were read
    summary = Published(BuildRecord.loads((published / "_BUILD.json").read_bytes(), "new"), "", []).summary()
    xcom = {k: v for k, v in summary.to_json().items() if k not in ("format", "reused")}  # as published before
    assert BuildSummary.from_json(xcom, "an older run's summary") == replace(summary, reused=None)
    marker = json.loads((published / "ranks/_completions/00000.json").read_text())
    del marker["format"]
    assert CompletionMarker.from_json(marker, "untagged").to_json() == marker | {
        "format": CompletionMarker.format_tag()
    }


def test_params_an_older_version_wrote_read_typed_and_write_back_unchanged(published: Path) -> None:
    """A plan's params and a stage's are open records: an option the version that wrote them had and this one has
    not is kept, one it did not have yet reads as its default and is not written back. So an old build's plan has
    the digest its manifests name, and its manifests write back byte for byte."""
    claim = json.loads((published / "_RUN.json").read_text())
    params = claim["plan"]["params"]
    del params["split_input_mb"], params["output_format"]  # options it did not have yet
    params["retired_option"] = [1, 2]  # one since removed
    old = RunClaim.from_json(claim, "an older claim")
    assert old.plan is not None and old.to_json() == claim
    digest = hashlib.sha256(orjson.dumps(claim["plan"], option=orjson.OPT_SORT_KEYS)).hexdigest()
    assert Plan(old.plan).digest == digest
    assert (old.plan.params.split_input_mb, old.plan.params.output_format) == (None, None)
    assert old.plan.params.context_window == 1025 and old.plan.params.extra["retired_option"] == [1, 2]
    new = RunClaim.loads((published / "_RUN.json").read_bytes(), "new")
    assert new.plan is not None and new.plan.params.output_format == "ds"
    named = RankManifest.loads((published / "ranks/_manifests/00000.json").read_bytes(), "a rank manifest").plan
    assert Plan(new.plan).digest == named
    rank = json.loads((published / "ranks/_manifests/00000.json").read_text())
    del rank["params"]["num_buckets"], rank["params"]["save_loss"]
    rank["params"]["retired_option"] = "kept"
    data = orjson.dumps(rank, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS)
    record = RankManifest.loads(data, "an older rank manifest")
    assert record.dumps() == data
    assert (record.num_buckets, record.saves_loss, record.prefix) == (None, False, rank["params"]["save_filename"])
    context = json.loads((published / "context/_manifests/context_00000.json").read_text())
    assert ContextManifest.from_json(context, "").context_window == 1025
    del context["params"]["context_window"]
    with pytest.raises(ValueError, match=r"^context_window null is not a window's tokens$"):
        _ = ContextManifest.from_json(context, "").context_window


def test_verify_names_a_damaged_record_in_one_line(published: Path, tmp_path: Path) -> None:
    """The command line's verify: a flipped key, a newer format tag and a truncated marker each give one line."""
    cases = {
        "ranks/_manifests/00000.json": lambda p: _damaged(p, lambda r: r.__setitem__("ouputs", r.pop("outputs"))),
        "merged/_manifests/corpus.json": lambda p: _damaged(
            p, lambda r: r.__setitem__("format", "corpus-tokenization/merge-manifest/9")
        ),
        "context/_completions/context_00000.json": lambda p: p.write_bytes(p.read_bytes()[:40]),
    }
    expected = {
        "ranks/_manifests/00000.json": "not a valid manifest: outputs is missing",
        "merged/_manifests/corpus.json": "is newer than this version of corpus-tokenization reads",
        "context/_completions/context_00000.json": "not a valid completion marker: not JSON",
    }
    for name, damage in cases.items():
        copy = tmp_path / name.split("/")[0]
        subprocess.run(["cp", "-r", str(published / name.split("/")[0]), str(copy)], check=True)
        (tmp_path / "_RUN.json").write_bytes((published / "_RUN.json").read_bytes())
        damage(tmp_path / name)
        run = subprocess.run(
            [sys.executable, "-m", "tokenization.cli", "verify", str(copy)], capture_output=True, text=True, cwd=ROOT
        )
        assert run.returncode == 1, run.stderr
        lines = [line for line in run.stdout.splitlines() if str(tmp_path / name) in line]
        assert len(lines) == 1 and expected[name] in lines[0], run.stdout
        assert "Traceback" not in run.stderr


def test_the_summary_command_names_a_damaged_build_record(published: Path, tmp_path: Path) -> None:
    out = tmp_path / "builds"
    subprocess.run(["cp", "-r", str(published.parent), str(out)], check=True)
    record = out / "records" / "_BUILD.json"
    record.write_bytes(record.read_bytes()[:-30])
    run = subprocess.run(
        [sys.executable, "-m", "tokenization.builds", str(out)], capture_output=True, text=True, cwd=ROOT
    )
    assert run.returncode == 1
    assert run.stderr.startswith(f"error: {record}: not a valid build record: not JSON") and run.stderr.count("\n") == 1
    original = read_build(Folder(str(published)))
    assert original is not None and original.tokens > 0  # the original is untouched


def test_a_resumed_build_tokenizes_again_a_rank_whose_marker_is_damaged(
    published: Path, tmp_path: Path, sample_corpus, sample_tokenizer
) -> None:
    """A truncated marker is a rank not complete, with its one line as the reason; the resumed build tokenizes that
    rank again, to the same bytes (a build that keeps its intermediate files: the others' rank files are there)."""
    build = Build.start(_config(tmp_path, sample_corpus, sample_tokenizer, keep_intermediate=True), "records")
    build.run()
    build.unpublish()
    marker = tmp_path / "records/ranks/_completions/00001.json"
    marker.write_bytes(marker.read_bytes()[:25])
    why = f"{marker}: not a valid completion marker: not JSON (unexpected end of data: line 1 column 26 (char 25))"
    assert build.incomplete_ranks() == {1: why}
    original = read_build(Folder(str(published)))
    assert original is not None and build.run().record.digest == original.digest
    assert build.incomplete_ranks() == {}


def test_every_record_kind_is_defined_once_and_exported_by_the_package() -> None:
    """Readers import records from the package: a kind added to a topic module but not exported would be found by
    no reader that follows the rule, and one defined in two topics would be two kinds."""
    import tokenization.records as records

    topics = sorted(info.name for info in pkgutil.iter_modules(records.__path__))
    assert topics == ["builds", "cache", "codec", "contents", "inputs", "mixtures", "params", "stages", "tokenizer"]
    kinds: dict[str, type] = {}
    for topic in topics:
        module = importlib.import_module(f"tokenization.records.{topic}")
        for name, value in vars(module).items():
            if isinstance(value, type) and value.__module__ == module.__name__ and not name.startswith("_"):
                assert name not in kinds, f"{name} is defined in two topics"
                kinds[name] = value
    missing = sorted(name for name, kind in kinds.items() if getattr(records, name, None) is not kind)
    assert not missing, f"not exported by tokenization.records: {missing}"


def test_a_topic_is_loaded_when_a_kind_of_it_is_first_asked_for() -> None:
    """The package imports a topic's module when one of its kinds is first asked for, so that a rank (the tokenize
    stage, with the output and cache modules it uses) never loads the build records; a name it does not export is
    an AttributeError."""
    code = (
        "import sys; import tokenization.stages.tokenize; import tokenization.records as records\n"
        "print('tokenization.records.builds' in sys.modules, records.RunClaim.__module__)\n"
        "try: records.NotAKind\nexcept AttributeError as e: print(e)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "False tokenization.records.builds",
        "module 'tokenization.records' has no attribute 'NotAKind'",
    ]


def test_a_large_record_read_again_with_its_bytes_is_decoded_once_and_other_bytes_afresh() -> None:
    """A build's process reads its plan and its ranks' manifests again and again: the same bytes give the record
    decoded the first time, while bytes that differ in one field are decoded (and checked) as the first were."""
    from tokenization.records import InputFile, PlannedInputs
    from tokenization.records.codec import DECODED_BYTES

    files = [InputFile(url=f"/in/{k:05d}.jsonl", size=k, identity=f"mtime_ns={k}") for k in range(2000)]
    data = orjson.dumps(PlannedInputs(files=files, skipped=[], hidden=0).to_json())
    assert len(data) >= DECODED_BYTES
    first = PlannedInputs.loads(data, "a.json")
    assert first.files == files
    assert PlannedInputs.loads(bytes(bytearray(data)), "b.json") is first  # equal bytes, read again
    changed = PlannedInputs.loads(data.replace(b'"/in/00007.jsonl"', b'"/in/00008.jsonl"'), "c.json")
    assert [f.url for f in changed.files[6:9]] == ["/in/00006.jsonl", "/in/00008.jsonl", "/in/00008.jsonl"]
    with pytest.raises(RecordError, match=r"^d\.json: .*bytes"):
        PlannedInputs.loads(data.replace(b'"bytes":7,', b'"bytes":"7",'), "d.json")
    small = orjson.dumps(PlannedInputs(files=files[:3], skipped=[], hidden=0).to_json())
    assert PlannedInputs.loads(small, "e.json") is not PlannedInputs.loads(small, "e.json")  # cheap: not kept


def test_a_decoded_record_shared_by_its_readers_cannot_be_changed_by_one() -> None:
    """The same bytes give every reader one record (kept decoded): a frozen dataclass, whose lists and dicts were
    plain ones, so a reader that sorted or appended to them changed every other's record, and what it held was no
    longer what the file holds. Its lists and dicts (typed fields, an open record's extra keys, ``Any`` values)
    refuse any change; they are read, compared, copied, pickled and written back as ever."""
    import copy
    import pickle

    from tokenization.records import InputFile, PlannedInputs, StageParams

    files = [InputFile(url=f"/in/{k:05d}.jsonl", size=k, identity=f"mtime_ns={k}") for k in range(2000)]
    data = orjson.dumps(PlannedInputs(files=files, skipped=[], hidden=0).to_json())
    shared = PlannedInputs.loads(data, "a.json")
    changes = [
        lambda: shared.files.append(files[0]),
        lambda: shared.files.sort(key=lambda f: f.size, reverse=True),
        lambda: shared.files.__setitem__(0, files[1]),
        lambda: shared.files.__delitem__(slice(0, 10)),
        lambda: shared.files.clear(),
    ]
    for change in changes:
        with pytest.raises(TypeError, match=r"a decoded record's .* cannot be changed"):
            change()
    again = PlannedInputs.loads(data, "b.json")
    assert again is shared and again.files == files and again.dumps() == PlannedInputs.loads(data, "c").dumps()
    assert copy.deepcopy(shared) == pickle.loads(pickle.dumps(shared)) == shared
    assert sorted(shared.files, key=lambda f: -f.size)[0] == files[-1] and [*shared.files] == files

    params = StageParams.from_json({"user": {"tags": ["a"], "n": 1}}, "p.json")
    with pytest.raises(TypeError):
        params.extra["user"]["tags"].append("b")
    with pytest.raises(TypeError):
        params.extra["other"] = 1
    assert orjson.loads(orjson.dumps(params.to_json()))["user"] == {"tags": ["a"], "n": 1}


def test_a_run_read_again_is_refused_once_its_claim_is_another_plans(tmp_path, sample_corpus, sample_tokenizer) -> None:
    """Each step reads the run's claim again (``Run.of``), kept decoded between reads: a claim replaced meanwhile
    by another plan's is refused, naming both digests, however often the first was read."""
    from tokenization.builds.plan import Run
    from tokenization.output.runs import BuildError

    first = Build.start(_config(tmp_path / "a", sample_corpus, sample_tokenizer), "night")
    other = Build.start(_config(tmp_path / "b", sample_corpus, sample_tokenizer, text_key="body"), "night")
    spec = first.claimed.spec
    assert Run.of(spec).plan.digest == Run.of(spec).plan.digest == spec.digest
    (tmp_path / "a" / "night" / "_RUN.json").write_bytes((tmp_path / "b" / "night" / "_RUN.json").read_bytes())
    said = f"records plan {other.claimed.spec.digest}, not this run's plan {spec.digest}"
    with pytest.raises(BuildError, match=said):
        Run.of(spec)
