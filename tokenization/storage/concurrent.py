"""Requests that wait, made at once: what the layers above use of ``files``' concurrency (reads of many small
records, files moved several at a time, work done beside a stage's main loop), so that ``files``, the fsspec
functions under ``Folder``, stays private to ``storage``."""

from tokenization.storage.files import CONCURRENT_READS, files_at_once, in_batches, map_concurrently, meanwhile

__all__ = ["CONCURRENT_READS", "files_at_once", "in_batches", "map_concurrently", "meanwhile"]
