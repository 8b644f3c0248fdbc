"""The token-file formats: datatrove's ``.ds`` family (``ds.py``), Megatron's ``.bin/.idx`` (``megatron.py``) and
mosaicml streaming's MDS (``mds.py``); and what they share: file names (``names.py``), the byte-moving engine of
every shuffle and the merge (``moves.py``, reading through ``source_pool.py``), the permutation proof
(``contents.py``; a one-file shuffle's from its source's record, ``rejoin.py``), packing into windows
(``packing.py``), a mixture's ``.ds.source`` sidecar (``sidecar.py``) and the checks of a family that verify and the
stages share (``checks.py``, and what a block is held to: ``block_checks.py``).

A family is named by its first file; this is the one place that says which names in a folder are token files.
"""

from __future__ import annotations

from collections.abc import Iterable

from tokenization.storage.folder import Folder

DS = ".ds"
MEGATRON = ".bin"


def token_file_names(names: Iterable[str], suffixes: tuple[str, ...] = (DS, MEGATRON)) -> list[str]:
    """The token files among a folder's names, sorted by name as datatrove lists them."""
    return sorted(name for name in names if name.endswith(suffixes))


def list_token_files(folder: Folder, suffixes: tuple[str, ...] = (DS, MEGATRON)) -> list[str]:
    """URLs of the token files directly inside a folder, from one fresh listing."""
    return [folder.url_of(name) for name in token_file_names(folder.list(), suffixes)]
