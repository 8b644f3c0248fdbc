"""The compiled code of the pages' templates (``pages``), kept on this machine from one process to the next."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from jinja2 import BytecodeCache
from jinja2.bccache import Bucket

from tokenization.formats.native import cache_folder


class CompiledOnce(BytecodeCache):
    """The templates' compiled code, kept in the machine's cache folder beside the C helper's build
    (``native.cache_folder``): compiling them took 0.05-0.1 s of every publish, a tenth of a next night's. Jinja
    takes a kept one only for the very source it was compiled from (and this Jinja and Python); a folder that
    cannot be read or written is no cache, and the page is compiled as before."""

    def load_bytecode(self, bucket: Bucket) -> None:
        with contextlib.suppress(OSError), open(self._path(bucket), "rb") as kept:
            bucket.load_bytecode(kept)

    def dump_bytecode(self, bucket: Bucket) -> None:
        path = self._path(bucket)
        scratch = path.with_name(f"{path.name}.{os.getpid()}.tmp")  # another process may write it meanwhile
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(scratch, "wb") as out:
                bucket.write_bytecode(out)
            os.replace(scratch, path)
        except OSError:
            with contextlib.suppress(OSError):
                scratch.unlink()

    @staticmethod
    def _path(bucket: Bucket) -> Path:
        return cache_folder() / f"page-{bucket.key}.jinja"
