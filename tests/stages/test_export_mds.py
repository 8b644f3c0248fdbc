"""MDS output (``tokenization mds``): a build's context windows as mosaicml streaming's shards. streaming's own
``StreamingDataset`` reads every window back with the tokens, loss bytes and document ends of the ``.ds`` files, and
streaming's own ``MDSWriter`` writes the same bytes for the same samples (both in ``make streaming-env``'s
environment). An export run again gives the same bytes; one that fails leaves no index that names a half-written
set of shards. Builds: the sample tokenizer (2 bytes an id), Llama 3's (4 bytes), and packed windows."""

from __future__ import annotations

import filecmp
import json
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.support.paths import ROOT, shared_path
from tests.support.references import in_streaming_env
from tests.support.s3 import ON_BOTH_STORES
from tokenization.builds.config import BuildConfig
from tokenization.builds.run import Build
from tokenization.errors import UsageError
from tokenization.formats.ds import TokenFile, TokenFileError
from tokenization.stages.export_mds import EXPORTED, SOURCES, export_mds, mds_problems, window_of
from tokenization.storage.folder import Folder

WINDOW = 1025
PARTS = "part-0000{}.jsonl.gz"  # the sample corpus's files, a mixture's sources
MIXTURE = {
    "sources": [
        {"name": "web", "input": PARTS.format("[01]"), "weight": 5},
        {"name": "code", "input": PARTS.format(2), "weight": 4, "max_repetition": 2},
        {"name": "math", "input": PARTS.format(3), "weight": 1},
    ]
}
BUILDS: dict[str, tuple[str, dict[str, Any]]] = {
    "windows": ("sample", {}),
    "llama3": ("llama3", {}),
    "packed": ("sample", {"context_mode": "packed"}),
    "mixture": ("sample", {"mixture": MIXTURE}),
}
SMALL_SHARDS = 40_000  # bytes: a build of the sample corpus in 4 to 8 shards
# streaming's reader, in its own environment: every sample, each column's arrays in one .npz (``{column}_{i}``).
READ = """
import sys
import numpy as np
from streaming import StreamingDataset
data = StreamingDataset(local=sys.argv[1], shuffle=False, batch_size=1, validate_hash="sha1")
np.savez(sys.argv[2], **{f"{key}_{i}": value for i in range(len(data)) for key, value in data[i].items()})
print(len(data))
"""
# streaming's writer, on the samples of an .npz written as READ writes one, into a folder a size limit.
WRITE = """
import sys
import numpy as np
from streaming import MDSWriter
saved, columns = np.load(sys.argv[1]), dict(pair.split("=") for pair in sys.argv[2].split())
for out, limit in zip(sys.argv[3::2], sys.argv[4::2]):
    with MDSWriter(columns=columns, out=out, hashes=["sha1"], size_limit=int(limit)) as writer:
        for i in range(len(saved.files) // len(columns)):
            writer.write({key: saved[f"{key}_{i}"] for key in columns})
"""


@pytest.fixture(scope="module", params=sorted(BUILDS))
def run(request, tmp_path_factory, sample_corpus, sample_tokenizer) -> Path:
    """A published build of the sample corpus (or of a mixture of its files), its loss saved, in windows of 1,025
    tokens."""
    tokenizer, options = BUILDS[request.param]
    path = sample_tokenizer if tokenizer == "sample" else shared_path("tokenizers", "llama3", "tokenizer.json")
    output = tmp_path_factory.mktemp(request.param)
    if "mixture" in options:
        sources = [source | {"input": f"{sample_corpus}/{source['input']}"} for source in MIXTURE["sources"]]
        options = {"mixture": {"sources": sources}}
    config = BuildConfig(
        input=None if "mixture" in options else str(sample_corpus),
        output=str(output),
        tokenizer=str(path),
        seed=5,
        num_ranks=2,
        save_loss=True,
        context_window=WINDOW,
        num_context_shards=2,
        merge_max_tokens_per_file=20_000,
        **options,
    )
    Build.start(config, "b").run(parallel=1, progress=False)
    return output / "b"


def windows_in(run: Path) -> list[dict[str, np.ndarray]]:
    """The build's windows as its .ds files hold them: each file's tokens cut every 1,025, in file order, with its
    loss bytes and the index entries inside it (relative to it), and a mixture's their sources."""
    samples = []
    for path in sorted((run / "context").glob("*.ds")):
        file = TokenFile(str(path))
        tokens, loss, ends = np.asarray(file.tokens), np.asarray(file.loss), np.asarray(file.ends, dtype=np.int64)
        for start in range(0, len(tokens), WINDOW):
            end = min(start + WINDOW, len(tokens))
            inside = (ends > start) & (ends <= end)
            sample = {"tokens": tokens[start:end], "loss": loss[start:end], "doc_ends": (ends[inside] - start)}
            sample["doc_ends"] = sample["doc_ends"].astype("<u4")
            samples.append(sample | ({"sources": np.asarray(file.sources)[inside]} if file.sources is not None else {}))
    return samples


def encodings(sample: dict[str, np.ndarray]) -> str:
    """The columns of a sample, as MDSWriter's argument on the command line: ``doc_ends=ndarray:uint32 ...``."""
    return " ".join(f"{key}=ndarray:{value.dtype.name}" for key, value in sorted(sample.items()))


def saved(samples: list[dict[str, np.ndarray]], path: Path) -> Path:
    arrays: dict[str, Any] = {f"{key}_{i}": value for i, sample in enumerate(samples) for key, value in sample.items()}
    np.savez(path, **arrays)
    return path


def test_streaming_reads_every_window_with_its_tokens_loss_and_document_ends(run, tmp_path) -> None:
    done = export_mds(Folder(str(run)), Folder(str(tmp_path / "mds")), SMALL_SHARDS, progress=False)
    expected = windows_in(run)
    assert done.shards > 1 and done.windows == len(expected) and done.tokens == sum(len(s["tokens"]) for s in expected)
    printed = in_streaming_env(READ, str(tmp_path / "mds"), str(tmp_path / "read.npz"))
    read = np.load(tmp_path / "read.npz")
    assert int(printed) == len(expected) == len(read.files) // len(expected[0])
    token_size = TokenFile(str(next((run / "context").glob("*.ds")))).token_size
    for i, sample in enumerate(expected):
        assert read[f"tokens_{i}"].dtype == np.dtype(f"<u{token_size}")
        for key in expected[0]:
            assert np.array_equal(read[f"{key}_{i}"], sample[key]), (i, key)
    assert read[f"doc_ends_{len(expected) - 1}"][-1] == len(expected[-1]["tokens"])  # a window's end is its last


def test_the_bytes_are_those_streamings_own_writer_writes(run, tmp_path) -> None:
    """In 64 MiB shards (one) and in small ones (several): every file, index.json too, byte for byte; a mixture's
    source names beside them, in sources.json."""
    expected = windows_in(run)
    metadata = TokenFile(str(run / "context" / "000_corpus.ds")).metadata
    assert metadata is not None
    named = list(metadata.sources)
    limits = {"large": 1 << 26, "small": SMALL_SHARDS}
    theirs = [str(word) for name, limit in limits.items() for word in (tmp_path / f"theirs-{name}", limit)]
    in_streaming_env(WRITE, str(saved(expected, tmp_path / "s.npz")), encodings(expected[0]), *theirs)
    for name, limit in limits.items():
        ours = export_mds(Folder(str(run)), Folder(str(tmp_path / f"ours-{name}")), limit, progress=False)
        names = sorted(p.name for p in (tmp_path / f"ours-{name}").iterdir() if p.name not in (SOURCES, EXPORTED))
        assert names == sorted(p.name for p in (tmp_path / f"theirs-{name}").iterdir())
        mixed = (tmp_path / f"ours-{name}" / SOURCES).is_file()
        assert (json.loads((tmp_path / f"ours-{name}" / SOURCES).read_text()) if mixed else []) == named
        assert len(names) == ours.shards + 1 and (ours.shards > 1) == (name == "small")
        same = [filecmp.cmp(tmp_path / f"ours-{name}" / n, tmp_path / f"theirs-{name}" / n, False) for n in names]
        assert all(same), [n for n, equal in zip(names, same, strict=True) if not equal]


def test_run_again_the_same_bytes_and_no_shard_of_an_older_export_stays(run, tmp_path) -> None:
    out = Folder(str(tmp_path / "mds"))
    first = export_mds(Folder(str(run)), out, SMALL_SHARDS, progress=False)
    written = {p.name: p.read_bytes() for p in (tmp_path / "mds").iterdir()}
    (tmp_path / "mds" / ".shard.00002.mds.tmp-0123456789ab").write_bytes(b"half")  # a writer killed mid-put
    assert export_mds(Folder(str(run)), out, progress=False).shards == 1
    kept = sorted(p.name for p in (tmp_path / "mds").iterdir())
    assert kept == [EXPORTED, "index.json", "shard.00000.mds", *([SOURCES] if "sources" in windows_in(run)[0] else [])]
    assert export_mds(Folder(str(run)), out, SMALL_SHARDS, progress=False) == first
    assert {p.name: p.read_bytes() for p in (tmp_path / "mds").iterdir()} == written


def test_a_failed_export_leaves_no_index(run, tmp_path, monkeypatch) -> None:
    """The index is removed before the first shard is replaced, and written after the last: a reader finds either
    no dataset or a whole one."""
    out = Folder(str(tmp_path / "mds"))
    export_mds(Folder(str(run)), out, SMALL_SHARDS, progress=False)
    put = Folder.put

    def fails_on_the_third_shard(self, name, data, *args):
        if name == "shard.00002.mds":
            raise OSError(28, "No space left on device")
        return put(self, name, data, *args)

    monkeypatch.setattr(Folder, "put", fails_on_the_third_shard)
    with pytest.raises(OSError, match="No space"):
        export_mds(Folder(str(run)), out, SMALL_SHARDS, progress=False)
    assert not (tmp_path / "mds" / "index.json").exists()


def test_the_window_is_the_one_the_context_shuffle_cut(run, tmp_path) -> None:
    """Publish and ``tokenization mds`` take the window from the same place, the context shuffle's records: a build
    record that says another window (edited, or of a tool that records it otherwise) does not cut other samples."""
    copy = tmp_path / "b"
    shutil.copytree(run, copy)
    recorded = json.loads((copy / "_BUILD.json").read_text())
    recorded["params"]["context_window"] = 2 * WINDOW
    (copy / "_BUILD.json").write_text(json.dumps(recorded))
    done = export_mds(Folder(str(copy)), Folder(str(tmp_path / "mds")), progress=False)
    assert done.windows == len(windows_in(run)) and window_of(Folder(str(copy / "context"))) == WINDOW
    for name in (copy / "context" / "_manifests").glob("*.json"):
        manifest = json.loads(name.read_text())
        manifest["params"]["context_window"] = 7 if name.name.endswith("0.json") else WINDOW
        name.write_text(json.dumps(manifest))
    with pytest.raises(TokenFileError, match=r"context: windows of \[7, 1025\] tokens: MDS samples are the windows"):
        window_of(Folder(str(copy / "context")))


def test_what_is_refused_is_named(run, tmp_path, sample_corpus, sample_tokenizer) -> None:
    with pytest.raises(UsageError, match=r"no published build there \(no _BUILD.json\)"):
        export_mds(Folder(str(run / "context")))
    config = BuildConfig(
        input=str(sample_corpus), output=str(tmp_path), tokenizer=str(sample_tokenizer), seed=5, context_window=0
    )
    Build.start(config, "merged-only").run(progress=False)
    with pytest.raises(UsageError, match="the build has no context windows"):
        export_mds(Folder(str(tmp_path / "merged-only")))
    with pytest.raises(
        UsageError, match=f"context/ is inside the build's own folder, where MDS goes only in {run}/mds"
    ):
        export_mds(Folder(str(run)), Folder(str(run / "context") + "/"))
    copy = tmp_path / "copy"
    subprocess.run(["cp", "-r", str(run), str(copy)], check=True)
    last = sorted((copy / "context").glob("*.ds"))[-1]
    Path(f"{last}.loss").rename(f"{last}.loss.kept")
    with pytest.raises(
        TokenFileError, match=rf"{last.name}: \d bytes a token, no .loss[^;]*; .*: one MDS dataset holds one"
    ):
        export_mds(Folder(str(copy)), Folder(str(tmp_path / "mds")), progress=False)
    Path(f"{last}.loss.kept").rename(f"{last}.loss")
    index = sorted((copy / "context").glob("*.ds.index"))[0]
    ends = np.fromfile(index, dtype="<u8")
    ends[np.flatnonzero(ends == WINDOW)[0]] += 1  # the first window's end moved a token on
    ends.tofile(index)
    with pytest.raises(TokenFileError, match=rf"{index.name}: an entry does not end each window of 1,025 tokens"):
        export_mds(Folder(str(copy)), progress=False)


def test_the_command_writes_into_the_run_folder(run) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "tokenization.cli", "mds", str(run)], capture_output=True, text=True, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr
    windows = len(windows_in(run))
    index = json.loads((run / "mds" / "index.json").read_text())
    assert sum(shard["samples"] for shard in index["shards"]) == windows
    assert done.stdout.startswith(f"mds {run / 'mds'}: {windows:,} windows, ")


def test_a_build_with_mds_publishes_it_and_verify_holds_it_to_the_record(tmp_path, sample_corpus, sample_tokenizer):
    """``mds``: publish writes the windows as MDS before the build record, which names the index's sha256; verify of
    the run folder then checks the index and each shard's sha1 against it."""
    options: dict[str, Any] = dict(
        input=str(sample_corpus), output=str(tmp_path), tokenizer=str(sample_tokenizer), seed=5
    )
    config = BuildConfig(**options, save_loss=True, context_window=WINDOW, num_ranks=2, mds=True)
    record = Build.start(config, "b").run(progress=False).record
    run = tmp_path / "b"
    again = export_mds(Folder(str(run)), Folder(str(tmp_path / "again")), progress=False)
    assert record.mds == replace(again, folder=str(run / "mds"))
    assert record.mds.folder == str(run / "mds") and record.mds.windows == len(windows_in(run))
    assert {p.name: p.read_bytes() for p in (run / "mds").iterdir()} == {
        p.name: p.read_bytes() for p in (tmp_path / "again").iterdir() if p.name != EXPORTED
    }
    assert record.footprint is not None
    assert "mds" in [folder.name for folder in record.footprint.folders]
    with pytest.raises(UsageError, match=r"holds the MDS that publish wrote in 67,108,864-byte shards"):
        export_mds(Folder(str(run)), size_limit=SMALL_SHARDS)
    assert export_mds(Folder(str(run)), progress=False) == record.mds  # the same bytes again: a damaged copy mended

    def verified() -> subprocess.CompletedProcess:
        command = [sys.executable, "-m", "tokenization.cli", "verify", str(run)]
        return subprocess.run(command, capture_output=True, text=True, cwd=ROOT)

    assert verified().returncode == 0 and f"{run / 'mds'}: 1 MDS shard as the build record says" in verified().stdout
    shard = run / "mds" / "shard.00000.mds"
    data = bytearray(shard.read_bytes())
    data[-1] ^= 1
    shard.write_bytes(bytes(data))
    failed = verified()
    assert failed.returncode == 1 and f"{shard}: its sha1 is not the " in failed.stdout
    (run / "mds" / "index.json").unlink()
    assert f"{run / 'mds' / 'index.json'} is missing: the build record says publish wrote it" in verified().stdout
    with pytest.raises(UsageError, match="mds writes the context windows as MDS samples: it needs a context_window"):
        BuildConfig(**options, context_window=0, mds=True)


@ON_BOTH_STORES
def test_a_build_on_s3_writes_the_same_mds(tmp_path, s3, sample_corpus, sample_tokenizer) -> None:
    """A build whose output is on S3 writes its MDS there, byte for byte the local build's; verify reads it back."""
    settings: dict[str, Any] = dict(input=str(sample_corpus), tokenizer=str(sample_tokenizer), seed=5, num_ranks=2)
    settings |= dict(mds=True, save_loss=True, context_window=WINDOW)
    local = Build.start(BuildConfig(output=str(tmp_path), **settings), "b").run(progress=False).record
    remote = BuildConfig(output="s3://corpus/builds", storage_options=s3.options, **settings)
    record = Build.start(remote, "b").run(progress=False).record
    assert local.mds is not None and record.mds is not None
    assert record.mds == replace(local.mds, folder="s3://corpus/builds/b/mds")
    s3.fs.invalidate_cache()
    for path in (tmp_path / "b" / "mds").iterdir():
        assert s3.fs.cat_file(f"corpus/builds/b/mds/{path.name}") == path.read_bytes(), path.name
    assert mds_problems(record.mds, Folder("s3://corpus/builds/b/mds", s3.options)) == []


def test_a_window_larger_than_the_shard_size_gets_a_shard_of_its_own(run, tmp_path) -> None:
    """MDSWriter would put an empty shard before it; each shard here holds one window, and no shard is empty."""
    done = export_mds(Folder(str(run)), Folder(str(tmp_path / "mds")), 1_000, progress=False)
    index = json.loads((tmp_path / "mds" / "index.json").read_text())
    assert done.shards == done.windows == len(windows_in(run))
    assert {shard["samples"] for shard in index["shards"]} == {1}


def mds_command(*args: object) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tokenization.cli", "mds", *map(str, args)], capture_output=True, text=True, cwd=ROOT
    )


def refusal(done: subprocess.CompletedProcess) -> str:
    """The one line a refused command ends with (after its usage), its exit status 2."""
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    return done.stderr.splitlines()[-1]


@pytest.fixture(scope="module")
def two_builds(tmp_path_factory, sample_corpus, sample_tokenizer) -> Path:
    """Builds ``a`` and ``b`` of the sample corpus in one output, in windows; ``b`` published its MDS."""
    output = tmp_path_factory.mktemp("two")
    for name, seed in (("a", 1), ("b", 2)):
        config = BuildConfig(
            input=str(sample_corpus), output=str(output), tokenizer=str(sample_tokenizer), seed=seed,
            context_window=WINDOW, mds=name == "b",
        )  # fmt: skip
        Build.start(config, name).run(parallel=1, progress=False)
    return output


def test_an_export_writes_into_no_other_builds_folder_nor_over_what_a_folder_holds(two_builds, tmp_path) -> None:
    """``--out`` inside another build's run folder, or this build's other than its ``mds/``, or a cache, or a
    folder of token files or of another build's MDS: refused in one line, and nothing there changes."""
    a, b = two_builds / "a", two_builds / "b"
    held = {p: p.read_bytes() for p in b.rglob("*") if p.is_file()}
    for out in (b / "mds", b / "context", b / "merged" / "new", b):
        assert refusal(mds_command(a, "--out", out)) == (
            f"tokenization mds: error: {out} is inside the folder of another build, {b} (it holds _BUILD.json): "
            f"MDS of {a} goes in its own mds/ or in a folder outside every build's"
        )
    assert {p: p.read_bytes() for p in b.rglob("*") if p.is_file()} == held
    assert refusal(mds_command(a, "--out", a / "ranks")).endswith(
        f"{a / 'ranks'} is inside the build's own folder, where MDS goes only in {a}/mds"
    )
    (two_builds / ".cache").mkdir(exist_ok=True)
    (two_builds / ".cache" / "_CACHE.json").write_text("{}")
    assert refusal(mds_command(a, "--out", two_builds / ".cache" / "mds")).endswith(
        f"{two_builds / '.cache' / 'mds'} is inside the tokenization cache {two_builds / '.cache'}: MDS goes in a "
        "folder of its own"
    )
    assert refusal(mds_command(a, "--out", two_builds)).endswith(
        f"{two_builds} is a builds output (it holds LATEST, beside its builds): MDS goes in a folder of its own"
    )
    tokens = tmp_path / "tokens"
    tokens.mkdir()
    (tokens / "000_part.ds").write_bytes(b"\0" * 4)
    assert refusal(mds_command(a, "--out", tokens)).endswith(
        f"{tokens} holds token files (000_part.ds): MDS goes in a folder of its own"
    )
    out = tmp_path / "mds"
    assert mds_command(a, "--out", out).returncode == 0
    exported = {p.name: p.read_bytes() for p in out.iterdir()}
    assert mds_command(a, "--out", out).returncode == 0  # this build's own export, written again
    assert refusal(mds_command(b, "--out", out)).endswith(
        f"{out} holds an MDS dataset of {a}, not of {b}: remove it, or choose another --out"
    )
    assert {p.name: p.read_bytes() for p in out.iterdir()} == exported
    (out / EXPORTED).unlink()
    assert refusal(mds_command(a, "--out", out)).endswith(
        f"{out} holds an MDS dataset that no {EXPORTED} names, not of {a}: remove it, or choose another --out"
    )


def test_mds_arguments_are_checked_where_they_are_parsed(two_builds) -> None:
    """A file where a folder goes, and a shard size MDS cannot hold: one line each, exit status 2."""
    a, record = two_builds / "a", two_builds / "a" / "_BUILD.json"
    assert (
        refusal(mds_command(record))
        == f"tokenization mds: error: {record} is a file: RUN_DIR is a published build's folder"
    )
    for out in (record, record / "mds"):
        assert refusal(mds_command(a, "--out", out)) == (
            f"tokenization mds: error: {record} is a file: --out names the MDS dataset's folder"
        )
    for size, said in (("0", "0"), ("4GiB", "4GiB is 4,294,967,296"), ("5GB", "5GB is 5,000,000,000")):
        assert refusal(mds_command(a, "--shard-size", size)) == (
            f"tokenization mds: error: argument --shard-size: {said} bytes; an MDS shard holds 1 to 4,294,967,295 "
            "(4GiB - 1: its offsets are 32-bit)"
        )
