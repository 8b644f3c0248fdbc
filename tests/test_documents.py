"""Reading ahead on a thread keeps the order, raises the reader's errors where they are consumed, and stops."""

from __future__ import annotations

import threading

import pytest

from tokenization.documents import prefetched


def test_prefetched_keeps_order_and_raises_the_producers_error() -> None:
    def items():
        yield from range(1000)
        raise ValueError("input.jsonl line 1001: not JSON")

    seen = []
    with pytest.raises(ValueError, match="line 1001"):
        for item in prefetched(items(), chunk=7, depth=2):
            seen.append(item)
    assert seen == list(range(1000))


def test_stopping_early_stops_the_reader() -> None:
    produced = []

    def items():
        for i in range(10**9):
            produced.append(i)
            yield i

    for item in prefetched(items(), chunk=4, depth=2):
        if item == 10:
            break
    assert not [t for t in threading.enumerate() if t.name == "read"]
    assert len(produced) < 100
