"""The index check reports the same problems whether an index is checked in one chunk or in many."""

from __future__ import annotations

import numpy as np
import pytest

from tokenization.formats import block_checks
from tokenization.formats.block_checks import Checks, Report, check_index


def problems(ends: np.ndarray, chunk: int, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    monkeypatch.setattr(block_checks, "INDEX_CHUNK", chunk)
    report = Report()
    check_index(ends, "f.ds", Checks(eos_id=0), report)
    return report.problems


def test_an_index_checked_in_chunks_reports_what_it_reports_whole(monkeypatch) -> None:
    ends = np.arange(10, 10 * 1001, 10, dtype=np.int64)
    ends[[99, 100]] = ends[[100, 99]]  # out of order where two chunks of 100 meet
    ends[500:530] = ends[499]  # 30 empty documents, across two chunks of 100
    ends[[700, 701]] = ends[[701, 700]]
    whole = problems(ends, 1 << 20, monkeypatch)
    assert whole[:2] == [
        "f.ds.index @ token 1000: entry smaller than the one before",
        "f.ds.index @ token 7010: entry smaller than the one before",
    ]
    assert "f.ds.index: empty document: 20 more like this" in whole
    for chunk in (1, 7, 100):
        assert problems(ends, chunk, monkeypatch) == whole, chunk


def test_an_index_of_one_entry_or_none_has_nothing_to_compare(monkeypatch) -> None:
    for ends in (np.zeros(0, np.int64), np.array([5], np.int64)):
        assert problems(ends, 1, monkeypatch) == []
    assert problems(np.array([-1], np.int64), 1, monkeypatch) == ["f.ds.index @ token 0: negative first entry"]
