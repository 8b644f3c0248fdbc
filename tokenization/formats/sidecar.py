"""A mixture's ``X.ds.source`` sidecar (``formats.ds``): the source of each index entry, written beside a family
once its writer closed it, and its metadata's fourth line naming the sources.

A stage knows each unit's source as it orders units (a rank its documents, the merge its uses, the context shuffle
the pieces of its windows), and its writer splits the stream into files by tokens: ``attach`` gives each written
family its share of the entries, in order, and adds the two files to the family, so that they are published,
listed and checked with it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from tokenization.formats.contents import of_sources
from tokenization.formats.ds import SOURCE, SOURCE_DTYPE, Metadata, TokenFileError, WrittenTokenFile
from tokenization.formats.hashed_file import written_whole
from tokenization.storage.folder import Folder


def attach(written: Sequence[WrittenTokenFile], sources: np.ndarray, names: Sequence[str]) -> list[WrittenTokenFile]:
    """The families, each with its ``.source`` sidecar (its share of ``sources``, one a written index entry, in
    order) and the source ``names`` in its metadata, and each piece's source in its contents (``formats.contents``:
    its writer kept each entry's hash, ``keep_hashes``)."""
    entries = [family.index_entries for family in written]
    if sum(entries) != len(sources):
        raise TokenFileError(f"{len(sources):,} sources for {sum(entries):,} index entries: a bug")
    bounds = np.cumsum([0, *entries])
    return [_attached(family, sources[bounds[k] : bounds[k + 1]], names) for k, family in enumerate(written)]


def _attached(family: WrittenTokenFile, sources: np.ndarray, names: Sequence[str]) -> WrittenTokenFile:
    """One family with its sidecar and its metadata's names, each written whole (``Folder.put``)."""
    meta_path = family.path.with_name(f"{family.path.name}.metadata")
    meta = Metadata.parse(meta_path.read_text(encoding="utf-8"), str(meta_path))
    added = {
        f"{family.path.name}{SOURCE}": np.ascontiguousarray(sources, dtype=SOURCE_DTYPE).tobytes(),
        meta_path.name: replace(meta, sources=tuple(names)).render().encode(),
    }
    folder = Folder(str(family.path.parent))
    for name, data in added.items():
        folder.put(name, data)
    kept = tuple(f for f in family.files if f.name not in added)
    if family.hashes is None:
        raise TokenFileError(f"{family.path}: written without its entries' hashes, which its sources go into: a bug")
    return replace(
        family,
        files=kept + tuple(written_whole(name, data) for name, data in added.items()),
        contents=of_sources(family.contents, family.hashes, sources),
    )
