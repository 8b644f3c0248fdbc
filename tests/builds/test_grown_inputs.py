"""Issue 52: a night costs what changed. A local file that grew by whole lines appended since the last night costs
its new lines: its rank proves the earlier bytes unchanged (their sha256, in the read that hashes the file), takes
their documents from the cache entry of those bytes, checked as any hit, and encodes only the lines after them
(``inputs.grown``, ``stages.tokenize.appended``). The build is, byte for byte, the build without a cache."""

from __future__ import annotations

import gzip
import json
import logging
import os
import time
from pathlib import Path

import numpy as np
import orjson
import pytest

from tests.support.builds import config_of, in_process
from tests.support.corpus import sample_records, write_jsonl
from tokenization.builds.complete import cache_line
from tokenization.builds.run import Build
from tokenization.inputs import content, grown
from tokenization.output.cache import ENTRIES, names
from tokenization.progress import Progress
from tokenization.records import InputFile
from tokenization.storage.checksums import BLAKE3, checksum

HOUR_NS = 3600 * 10**9
MORE = [
    {"text": "one more document, appended the next night"},
    "{not json, appended",
    "",
    {"text": "and a last, masked", "no_loss_ranges": [[4, 9]]},
]


def corpus(folder: Path) -> Path:
    """The bundled sample's records in three plain JSON-lines files (one with records to quarantine, one with a
    loss range) and a gzip one, last modified an hour ago."""
    records = [r for r in sample_records() if isinstance(r, dict)]
    masked = {"text": "a masked document", "no_loss_ranges": [[0, 8]]}
    write_jsonl(folder / "a.jsonl", [*records[0:6], "{not json", {"txt": "no text field"}, "", masked, *records[6:12]])
    write_jsonl(folder / "b.jsonl", records[12:20])
    write_jsonl(folder / "c.jsonl", records[20:26])
    write_jsonl(folder / "d.jsonl.gz", records[26:32])
    for path in folder.iterdir():
        then = time.time_ns() - HOUR_NS
        os.utime(path, ns=(then, then))
    return folder


def appended(path: Path, records: list, *, gz: bool = False) -> None:
    """``records`` appended to ``path`` as JSON lines (a gzip member more for a compressed file)."""
    data = "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records).encode()
    path.write_bytes(path.read_bytes() + (gzip.compress(data, mtime=0) if gz else data))


def night(inputs: Path, out: Path, tokenizer: Path, name: str, **options):
    """A build of ``inputs`` into ``out`` under ``name``, in this process, published."""
    settings = {"max_reject_fraction": None} | options
    return in_process(Build.start(config_of(inputs, out, tokenizer, **settings), name))


def served(published) -> dict[str, dict]:
    """How the cache served each input file, by name, from the build's rank manifests."""
    manifests = Path(published.latest) / "ranks" / "_manifests"
    files = [f for p in sorted(manifests.glob("*.json")) for f in orjson.loads(p.read_bytes())["cache"]["files"]]
    return {f["url"].rsplit("/", 1)[-1]: f for f in files}


def dataset(published) -> dict[str, bytes]:
    """Every file the build published of its dataset and its ranks' quarantine, by path, with the digest."""
    run = Path(published.latest)
    found = {str(p.relative_to(run)): p.read_bytes() for p in sorted(Path(published.record.dataset).rglob("*.ds*"))}
    found |= {str(p.relative_to(run)): p.read_bytes() for p in sorted(run.glob("ranks/_quarantine/*.jsonl"))}
    return found | {"digest": published.record.digest.encode()}


def quarantined(published) -> list[tuple[str, int, str]]:
    run = Path(published.latest)
    lines = [json.loads(line) for p in sorted(run.glob("ranks/_quarantine/*.jsonl")) for line in p.open()]
    return sorted((r["file"].rsplit("/", 1)[-1], r["line"], r["reason"]) for r in lines)


@pytest.mark.parametrize("save_loss", [False, True])
@pytest.mark.parametrize("where", ["in its marker", "in a data folder"])
def test_a_file_grown_by_lines_encodes_only_them_and_builds_the_same_bytes(
    tmp_path, sample_tokenizer, monkeypatch, save_loss, where
) -> None:
    """The next night, ``a.jsonl`` has four lines more (a document, a malformed line, a blank one, a document):
    only they are encoded, the rest taken from the first night's entry of its earlier bytes; the gzip file that
    grew is encoded whole. The dataset, its loss bytes, the quarantine (the earlier part's records and the appended
    one's, at their lines) and the digest are the build's without a cache; the entry stored for the grown bytes
    is the one a cold build stores, and serves the night after as a hit. The earlier entry's files held in its
    marker (a small entry's) or in a data folder (a large one's); its loss bytes (a masked document's) taken whether
    the build saves loss or not."""
    if where == "in a data folder":
        monkeypatch.setattr(names, "INLINE_BYTES", -1)
    inputs = corpus(tmp_path / "in")
    first = night(inputs, tmp_path / "on", sample_tokenizer, "first", save_loss=save_loss)
    appended(inputs / "a.jsonl", MORE)
    appended(inputs / "d.jsonl.gz", MORE[:1], gz=True)
    nightly = night(inputs, tmp_path / "on", sample_tokenizer, "next", save_loss=save_loss)
    cold = night(inputs, tmp_path / "off", sample_tokenizer, "next", save_loss=save_loss, cache="off")
    assert dataset(nightly) == dataset(cold)
    how = served(nightly)
    assert {name: (f["hit"], f.get("appended_lines")) for name, f in how.items()} == {
        "a.jsonl": (False, 4),
        "b.jsonl": (True, None),
        "c.jsonl": (True, None),
        "d.jsonl.gz": (False, None),
    }
    assert quarantined(nightly) == [
        ("a.jsonl", 7, "malformed_json"),
        ("a.jsonl", 8, "missing_text"),
        ("a.jsonl", 18, "malformed_json"),
    ]
    earlier, grown = served(first)["a.jsonl"], how["a.jsonl"]  # what a rate of encoding leaves out: the earlier part
    assert (grown["reused_text_bytes"], grown["reused_tokens"]) == (earlier["text_bytes"], earlier["tokens"])
    assert grown["text_bytes"] - grown["reused_text_bytes"] == sum(len(r["text"]) for r in MORE if isinstance(r, dict))
    cache = nightly.record.cache
    assert (cache.files_grown, cache.lines_encoded) == (1, 4)
    assert "2 tokenized (1 of them grown by lines appended: 4 lines of theirs encoded, the rest taken from the " in (
        cache_line(cache)
    )
    shown = (Path(nightly.latest) / "report.html").read_text()
    assert '<th>of them, grown by lines appended</th><td data-key="files_grown">1</td>' in shown
    assert '<th>their new lines, encoded (the rest from the cache)</th><td data-key="lines_encoded">4</td>' in shown
    night(inputs, tmp_path / "fresh", sample_tokenizer, "next", save_loss=save_loss)
    assert entries(tmp_path / "on", "a.jsonl")[-1] == entries(tmp_path / "fresh", "a.jsonl")[0]
    third = night(inputs, tmp_path / "on", sample_tokenizer, "third", save_loss=save_loss)
    assert all(f["hit"] for f in served(third).values()) and dataset(third) | {"digest": b""} == dataset(cold) | {
        "digest": b""
    }


def entries(out: Path, name: str) -> list[tuple[str, dict, dict]]:
    """The cache's entries of input file ``name``: content, file sums and counts, the earliest made first."""
    found = []
    for marker in (out / "out" / ".cache" / ENTRIES).glob("*.json"):
        record = json.loads(marker.read_text())
        if record["source"]["url"].endswith(f"/{name}"):
            found.append((record["created"], (record["content"], record["files"], record["counts"])))
    return [entry for _, entry in sorted(found)]


@pytest.mark.parametrize(
    "change",
    [
        "a byte of its first line changed",
        "its first line removed, as long again appended",
        "its earlier bytes ended in no newline",
    ],
)
def test_a_file_changed_otherwise_is_encoded_whole(tmp_path, sample_tokenizer, change) -> None:
    """A file edited before its end, or whose earlier bytes did not end a line, did not grow by lines: it is
    encoded whole, and the build is the one without a cache."""
    inputs = corpus(tmp_path / "in")
    path = inputs / "c.jsonl"
    if change == "its earlier bytes ended in no newline":
        path.write_bytes(path.read_bytes().rstrip(b"\n"))
    night(inputs, tmp_path / "on", sample_tokenizer, "first")
    data = path.read_bytes()
    if change == "a byte of its first line changed":
        at = data.index(b'"text": "') + 9
        path.write_bytes(data[:at] + bytes([data[at] ^ 0x20]) + data[at + 1 :] + b'{"text": "more"}\n')
    elif change == "its first line removed, as long again appended":
        first, rest = data.split(b"\n", 1)
        path.write_bytes(rest + first + b"\n" + b'{"text": "more"}\n')
    else:
        path.write_bytes(data + b'\n{"text": "more"}\n')
    nightly = night(inputs, tmp_path / "on", sample_tokenizer, "next")
    assert (served(nightly)["c.jsonl"]["hit"], served(nightly)["c.jsonl"].get("appended_lines")) == (False, None)
    assert nightly.record.cache.files_grown is None
    assert 'data-key="files_grown"' not in (Path(nightly.latest) / "report.html").read_text()
    assert dataset(nightly) == dataset(night(inputs, tmp_path / "off", sample_tokenizer, "next", cache="off"))


def test_a_doctored_earlier_entry_is_caught_and_the_file_encoded_whole(tmp_path, sample_tokenizer, caplog) -> None:
    """The earlier bytes' entry serves a grown file only as a hit would: checked against its input. A token of it
    changed, with every checksum in its marker rewritten to match, is caught by its sample, the entry removed, and
    the grown file encoded whole: the build is the one without a cache."""
    inputs = corpus(tmp_path / "in")
    night(inputs, tmp_path / "on", sample_tokenizer, "first")
    marker = next(p for p in (tmp_path / "on/out/.cache" / ENTRIES).glob("*.json") if "/c.jsonl" in p.read_text())
    record = json.loads(marker.read_text())
    assert record.get("inline") is not None  # a small entry: its files in its marker
    import base64

    files = {n: base64.b64decode(data) for n, data in record["inline"].items()}
    tokens = np.frombuffer(files["segment.ds"], dtype=np.uint16).copy()
    tokens[0] = (int(tokens[0]) + 1) % 4096
    files["segment.ds"] = tokens.tobytes()
    record["inline"]["segment.ds"] = base64.b64encode(files["segment.ds"]).decode()
    record["files"] = {n: {"bytes": len(data), "blake3": checksum(data, BLAKE3)} for n, data in files.items()}
    record["counts"]["contents_in"] = None
    marker.write_text(json.dumps(record))
    appended(inputs / "c.jsonl", MORE[:1])
    caplog.set_level(logging.WARNING)
    nightly = night(inputs, tmp_path / "on", sample_tokenizer, "next")
    assert (served(nightly)["c.jsonl"]["hit"], served(nightly)["c.jsonl"].get("appended_lines")) == (False, None)
    assert f"{marker.stem}.json (of {inputs / 'c.jsonl'}): its document 0 is not what" in caplog.text
    assert dataset(nightly) == dataset(night(inputs, tmp_path / "off", sample_tokenizer, "next", cache="off"))


def test_the_proof_is_of_the_earlier_bytes_and_their_last_newline(tmp_path) -> None:
    """``grown.hashed`` reads a file once: its sha256, and its tail only when its first bytes are the earlier ones
    (their sha256) and end a line; the lines before the tail are counted, whatever the read's pieces."""
    path = tmp_path / "a.jsonl"
    earlier = b'{"text": "one"}\n\n{"text": "two"}\n'
    path.write_bytes(earlier + b'{"text": "three"}\n')
    sha = checksum(earlier, "sha256")
    listed = InputFile(
        str(path), path.stat().st_size, "mtime_ns=1,ctime_ns=1,ino=1,dev=1", earlier=f"{len(earlier)},{sha}"
    )
    whole = checksum(path.read_bytes(), "sha256")
    for piece in (1, 7, len(earlier), 1 << 20):
        grown.READ_BYTES = piece
        assert grown.hashed(str(path), listed) == (whole, grown.Tail(len(earlier), 3, sha))
    grown.READ_BYTES = 8 << 20
    assert (
        grown.hashed(str(path), InputFile(str(path), 1, listed.identity, earlier=f"{len(earlier) - 1},{sha}"))[1]
        is None
    )
    other = checksum(earlier[:-1] + b" ", "sha256")
    assert (
        grown.hashed(str(path), InputFile(str(path), 1, listed.identity, earlier=f"{len(earlier)},{other}"))[1] is None
    )
    assert grown.earlier(listed, f"{len(earlier)},1,1,1,1,1,{sha}") == f"{len(earlier)},{sha}"
    assert grown.earlier(InputFile(str(path) + ".gz", 99, listed.identity), f"10,1,1,1,1,1,{sha}") is None
    assert grown.earlier(listed, f"{path.stat().st_size},1,1,1,1,1,{sha}") is None  # not larger: not grown
    assert content.for_its_rank(listed)


@pytest.mark.parametrize("where", ["in its marker", "in a data folder"])
@pytest.mark.parametrize("on", ["its appended lines", "a file after it"])
def test_a_rank_redone_on_hf_takes_its_grown_file_again_and_counts_it_once(
    tmp_path, sample_tokenizer, monkeypatch, caplog, on, where
) -> None:
    """The fast engine disagrees with HF in the next night's rank holding the grown ``a.jsonl`` and ``c.jsonl``
    (the one with records quarantined before its appended lines, the other none): on ``a.jsonl``'s appended lines,
    or on the gzip file after them, once their joins are stored. The rank is redone on HF, its grown files taken
    from their earlier entries again: the build is the one without a cache, the grown files and their lines counted
    once, and the entries stored for the grown bytes (the fast engine's removed, HF's stored) a cold build's.
    The earlier entry's files held in its marker or in a data folder."""
    from tokenization.tokenizer import engines

    if where == "in a data folder":
        monkeypatch.setattr(names, "INLINE_BYTES", -1)
    monkeypatch.setattr(engines, "FAST_ENGINE_MIN_BYTES", 0)  # the fast engine even for the sample's few bytes
    inputs = corpus(tmp_path / "in")
    night(inputs, tmp_path / "on", sample_tokenizer, "first", num_ranks=1)
    appended(inputs / "a.jsonl", MORE)
    appended(inputs / "c.jsonl", MORE)
    appended(inputs / "d.jsonl.gz", [{"text": "the gzip file's appended document"}], gz=True)
    marker = {"its appended lines": "appended the next night", "a file after it": "the gzip file's"}[on]
    real, failed = engines.CheckedEngine.encode, list[engines.Group]()

    def disagrees_once(self, group):
        if not failed and any(marker in text for text in group.texts):
            failed.append(group)
            raise engines.EngineMismatch("a disagreement a test made")
        return real(self, group)

    monkeypatch.setattr(engines.CheckedEngine, "encode", disagrees_once)
    caplog.set_level(logging.WARNING)
    nightly = night(inputs, tmp_path / "on", sample_tokenizer, "next", num_ranks=1)
    assert failed and "falling back to HF tokenizers: a disagreement a test made" in caplog.text
    removed = "made by the fast engine in a rank where it then disagreed with HF" in caplog.text
    assert removed == (on == "a file after it")  # the grown file's entry, stored before the disagreement
    monkeypatch.setattr(engines.CheckedEngine, "encode", real)
    cold = night(inputs, tmp_path / "off", sample_tokenizer, "next", num_ranks=1, cache="off")
    assert dataset(nightly) == dataset(cold)
    assert {name: (f["hit"], f.get("appended_lines")) for name, f in served(nightly).items()} == {
        "a.jsonl": (False, 4),
        "b.jsonl": (True, None),
        "c.jsonl": (False, 4),
        "d.jsonl.gz": (False, None),
    }
    assert (nightly.record.cache.files_grown, nightly.record.cache.lines_encoded) == (2, 8)
    done = json.loads((Path(nightly.latest) / "_BUILD.json").read_text())
    assert (done["cache"]["files_grown"], done["cache"]["lines_encoded"]) == (2, 8)
    night(inputs, tmp_path / "fresh", sample_tokenizer, "next", num_ranks=1)
    for name in ("a.jsonl", "c.jsonl"):
        assert entries(tmp_path / "on", name)[1:] == entries(tmp_path / "fresh", name)
    third = night(inputs, tmp_path / "on", sample_tokenizer, "third", num_ranks=1)
    assert all(f["hit"] for f in served(third).values())
    assert dataset(third) | {"digest": b""} == dataset(cold) | {"digest": b""}


def test_a_grown_files_progress_counts_its_bytes_once(tmp_path, sample_tokenizer, monkeypatch) -> None:
    """A rank's progress over a grown file counts its earlier bytes as the hit is served and its appended ones as
    they are read: each rank ends at its total, the input's bytes, with the tokens it wrote, not past them."""
    inputs = corpus(tmp_path / "in")
    night(inputs, tmp_path / "on", sample_tokenizer, "first")
    appended(inputs / "a.jsonl", MORE)
    appended(inputs / "d.jsonl.gz", MORE[:1], gz=True)
    ended: list[tuple[int, int, int]] = []
    real = Progress.__exit__

    def recorded(self, exc_type, exc, tb) -> None:
        if self.unit == "B" and exc_type is None:
            ended.append((self.done, self.total, self.counts.get("tokens", 0)))
        real(self, exc_type, exc, tb)

    monkeypatch.setattr(Progress, "__exit__", recorded)
    nightly = night(inputs, tmp_path / "on", sample_tokenizer, "next")
    assert len(ended) == 2 and all(done == total for done, total, _ in ended)
    assert sum(total for _, total, _ in ended) == sum(p.stat().st_size for p in inputs.iterdir())
    assert sum(tokens for _, _, tokens in ended) == sum(f["tokens"] for f in served(nightly).values())
