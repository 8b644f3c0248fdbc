"""Reading ahead on a thread keeps the order, raises the reader's errors where they are consumed, and stops;
progress lines for task logs."""

from __future__ import annotations

import logging
import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from tests.support.corpus import sample_records, write_jsonl
from tests.support.tokenizers import EOS
from tokenization import progress
from tokenization.errors import LeaseLost
from tokenization.formats.ds import TokenFileWriter
from tokenization.output.attempts import FileLease
from tokenization.stages.count import CountConfig, count_tokens
from tokenization.stages.merge import merge
from tokenization.stages.merge.config import MergeConfig
from tokenization.stages.tokenize import TokenizeConfig, tokenize_rank
from tokenization.stages.tokenize.first_pass import FirstPass
from tokenization.stages.tokenize.segments import SEGMENTS
from tokenization.tokenizer import documents
from tokenization.tokenizer.counts import TooManyRejects
from tokenization.tokenizer.pipeline import ReadAhead


def test_prefetched_keeps_order_and_raises_the_producers_error() -> None:
    def items():
        yield from range(1000)
        raise ValueError("input.jsonl line 1001: not JSON")

    seen = []
    with pytest.raises(ValueError, match="line 1001"):
        for item in ReadAhead(items(), chunk=7, depth=2):
            seen.append(item)
    assert seen == list(range(1000))


def test_stopping_early_stops_the_reader() -> None:
    produced = []

    def items():
        for i in range(10**9):
            produced.append(i)
            yield i

    for item in ReadAhead(items(), chunk=4, depth=2):
        if item == 10:
            break
    assert not [t for t in threading.enumerate() if t.name == "read"]
    assert len(produced) < 100


def test_a_read_ahead_started_and_never_read_stops_when_closed() -> None:
    """A rank starts its next file's reading before it is consumed: closed unread, its producer ends, though the
    queue it fills is full."""
    produced = []

    def items():
        for i in range(10**9):
            produced.append(i)
            yield i

    with ThreadPoolExecutor(1, thread_name_prefix="read") as thread:
        ahead = ReadAhead(items(), chunk=4, depth=2, thread=thread)
        ahead.start()
        while len(produced) < 8:  # two chunks queued: the producer now waits for room
            time.sleep(0.01)
        ahead.close()
        assert thread.submit(lambda: "free").result(timeout=10) == "free"
    assert len(produced) < 100


def test_a_rank_reads_its_next_file_while_one_encodes_and_stops_reading_it_when_it_fails(
    tmp_path, sample_corpus, sample_tokenizer, monkeypatch
) -> None:
    """The next file's reading starts once a file is read to its end; a rank that then fails (here its lease is
    found lost) stops that reading too, rather than waiting for it forever, and raises its own error."""
    monkeypatch.setattr(documents, "SMALL_INPUT_BYTES", 0)  # every sample file is read ahead
    monkeypatch.setattr(documents, "READ_AHEAD_CHARS", 100)  # and its queue is full long before it is read
    started = []
    real_start = ReadAhead.start

    def start(self) -> None:
        started.append(self)
        real_start(self)

    def lost(self) -> None:
        if started:
            raise LeaseLost(f"{self.path}: taken over")

    monkeypatch.setattr(ReadAhead, "start", start)
    monkeypatch.setattr(FileLease, "check", lost)
    config = TokenizeConfig(
        inputs=[str(sample_corpus)], output=str(tmp_path), tokenizer=str(sample_tokenizer), eos_token=EOS
    )
    with pytest.raises(LeaseLost, match="taken over"):
        tokenize_rank(config)
    assert len(started) == 1 and started[0].stop.is_set()
    assert not [t for t in threading.enumerate() if t.name.startswith("read")]


def test_a_rank_hands_the_engine_each_files_first_batch_before_it_writes_the_file_before(
    tmp_path, sample_tokenizer, monkeypatch
) -> None:
    """Files one after another keep the engine busy: a file's first batch is in the engine before the file before it
    is written (``documents.prime``), and the rank writes what it writes taking each file alone on its turn: the same
    bytes, counts and quarantine, where a bad line that tops a file is quarantined under that file."""
    monkeypatch.setattr(documents, "SMALL_INPUT_BYTES", 0)  # every file is read ahead, as a real one is
    records = sample_records()
    for k in range(3):
        write_jsonl(tmp_path / "corpus" / f"{k}.jsonl.gz", [*["{not json"] * (k == 1), *records[k::3]])
    events: list[tuple[str, int]] = []
    real_prime, real_close = FirstPass._prime_next, TokenFileWriter.close

    def prime_next(self, i: int, threads) -> None:
        real_prime(self, i, threads)
        if (read := self._next.get(i + 1)) is not None and read.primed is not None and read.primed.pending:
            events.append(("in the engine", i + 1))

    def close(self):
        if self.path.parent.parent.name == SEGMENTS:
            events.append(("written", int(self.path.parent.name)))
        return real_close(self)

    def tokenized(out: str) -> tuple[dict[str, bytes], dict]:
        config = TokenizeConfig(
            inputs=[str(tmp_path / "corpus")],
            output=str(tmp_path / out),
            tokenizer=str(sample_tokenizer),
            eos_token=EOS,
            batch_bytes=8_000,  # several batches a file
        )
        counts = tokenize_rank(config).record.counts
        files = {p.name: p.read_bytes() for p in (tmp_path / out).rglob("*") if p.is_file() and "_" not in p.parts[-2]}
        return files | {"quarantine": (tmp_path / out / "_quarantine" / "00000.jsonl").read_bytes()}, counts.to_json()

    monkeypatch.setattr(TokenFileWriter, "close", close)
    monkeypatch.setattr(FirstPass, "_prime_next", prime_next)
    primed = tokenized("primed")
    assert events == [("in the engine", 1), ("written", 0), ("in the engine", 2), ("written", 1), ("written", 2)]
    monkeypatch.setattr(FirstPass, "_prime_next", lambda self, i, threads: None)
    assert primed == tokenized("one-at-a-time")
    assert primed[0]["quarantine"].endswith(b'/1.jsonl.gz","line":1,"reason":"malformed_json","raw":"{not json"}\n')
    assert primed[1]["rejected"] == {"malformed_json": 1} and primed[1]["docs_read"] == len(records) + 1


def test_progress_lines_for_task_logs(tmp_path, sample_corpus, sample_tokenizer, caplog, monkeypatch) -> None:
    """Where a bar would collapse into one line, each stage logs percent, counts, tokens/s and ETA."""
    monkeypatch.setattr(documents, "READ_AHEAD_CHARS", 10_000)  # the sample is smaller than one real chunk
    caplog.set_level(logging.INFO, logger="tokenization.progress")
    config = TokenizeConfig(
        inputs=[str(sample_corpus)],
        output=str(tmp_path / "ranks"),
        tokenizer=str(sample_tokenizer),
        eos_token=EOS,
        batch_bytes=20_000,
    )
    tokenize_rank(config, progress=1e-9)
    lines = [r.getMessage() for r in caplog.records if r.name == "tokenization.progress"]
    assert re.fullmatch(r"rank 0: 0\.0% of [\d.]+ kB, ETA unknown", lines.pop(0))  # as it starts: no counts yet
    pattern = LINE.format(unit="B|kB|MB", counts="docs, [\\d,]+ tokens")
    assert len(lines) > 5 and all(re.fullmatch(pattern, line) for line in lines), lines
    assert lines[-1].startswith("rank 0: 100.0% of ") and " 308 docs, 64,522 tokens, " in lines[-1]
    percents = [float(line.split(": ")[1].split("%")[0]) for line in lines]
    assert percents == sorted(percents) and percents[0] < 50  # it follows the encoding, not the read-ahead

    caplog.clear()
    merge(MergeConfig(input=str(tmp_path / "ranks"), output=str(tmp_path / "merged"), save_filename="m"), 1e-9)
    lines = [r.getMessage() for r in caplog.records if r.name == "tokenization.progress"]
    assert lines.pop(0) == "merge m: 0.0% of 64,522 tok, ETA unknown"
    pattern = LINE.format(unit="tok", counts="units, [\\d,]+ tokens")
    assert lines and all(re.fullmatch(pattern, line) for line in lines), lines
    assert lines[-1].startswith("merge m: 100.0% of 64,522 tok, 308 units, 64,522 tokens, ")


def test_a_short_stage_logs_as_it_starts_and_then_sooner_than_the_interval(caplog, monkeypatch) -> None:
    """Issue 54: a stage under 30 s showed only its final line in a task log. Its first line comes at the start,
    the next ones 2, 4, 8, 16 s apart, then every ``progress_seconds``."""
    now = [100.0]
    monkeypatch.setattr(progress.time, "monotonic", lambda: now[0])
    caplog.set_level(logging.INFO, logger="tokenization.progress")
    with progress.Progress("rank 0", 100, "B", 30) as shown:
        for second in range(1, 90):
            now[0] = 100.0 + second
            shown.update(second, docs=second)
    at = [float(r.getMessage().split(", ")[1].split()[0]) for r in caplog.records[1:-1]]  # the docs, one a second
    assert caplog.records[0].getMessage() == "rank 0: 0.0% of 100 B, ETA unknown"
    assert at == [2, 6, 14, 30, 60] and "(done in 89.0s)" in caplog.records[-1].getMessage()


LINE = (
    r"[\w ]+: \d+\.\d% of [\d,.]+ (?:{unit}), [\d,]+ {counts}, \d+\.\d\d Mtok/s, "
    r"ETA (?:\d+:\d\d:\d\d|unknown)( \(done in [\d.]+s\))?"
)


def test_too_many_rejects_still_names_the_text_key_and_the_fields_the_records_have(tmp_path, sample_tokenizer):
    """A wrong text key passes max_rejects long before the pass ends: that error, too, says what the records hold."""
    path = write_jsonl(tmp_path / "pairs.jsonl", [{"prompt": f"question {i}", "response": "answer"} for i in range(5)])
    with pytest.raises(TooManyRejects) as info:
        count_tokens(CountConfig(inputs=[str(path)], tokenizer=str(sample_tokenizer), max_rejects=2))
    assert str(info.value) == (
        f"count: 3 rejected records exceed max_rejects=2; latest: {path} line 3: missing_text; by reason: "
        f"missing_text 3; first: {path} line 1; text key 'text'; its records have the fields prompt, response"
    )


@pytest.mark.parametrize("stage", ["tokenize", "count"])
def test_max_record_bytes_reaches_the_reader(tmp_path, sample_tokenizer, stage: str) -> None:
    path = write_jsonl(tmp_path / "in.jsonl", [{"text": "short"}] * 200 + [{"text": "too long " * 10}])
    options: dict[str, Any] = {"inputs": [str(path)], "tokenizer": str(sample_tokenizer), "max_record_bytes": 50}
    if stage == "tokenize":
        counts = tokenize_rank(TokenizeConfig(output=str(tmp_path / "out"), eos_token=EOS, **options)).to_json()
        rejected, written = counts["counts"]["rejected"], counts["counts"]["docs_written"]
    else:
        record = count_tokens(CountConfig(**options)).record
        rejected, written = record.rejected, record.docs
    assert rejected == {"record_too_large": 1} and written == 200
