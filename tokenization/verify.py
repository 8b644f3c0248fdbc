"""``verify``: check an output folder of ``.ds`` families or Megatron ``.bin/.idx`` pairs before anyone trains.

Every problem is reported with its file and, where it has one, the token offset. Completeness comes first: the
folder's manifests list the file families it must hold, so a family that is missing, a family that no manifest
lists (a leftover, or the output of a stage that did not finish), a manifest without its completion marker, and
counts that differ from what the files hold are all problems. Files are then streamed in large blocks (tokens,
loss bytes and checksums in one pass), so memory stays bounded by the block size and the index arrays, and a
gigabyte takes seconds.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np
import orjson

from tokenization import manifest
from tokenization.encoding import Encoder
from tokenization.formats import DS, MEGATRON, token_file_names
from tokenization.formats.ds import INDEX_DTYPE, LOSS_DTYPE, Metadata, TokenFileError, map_array, token_dtype
from tokenization.formats.megatron import MegatronFile
from tokenization.storage import join, list_names, list_sizes, open_fs

BLOCK_BYTES = 64 << 20
MAX_REPORTED = 10  # problems of one kind reported per file, then a count


@dataclass
class Report:
    files: int = 0
    tokens: int = 0
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def problem(self, where: str, message: str, offset: int | None = None) -> None:
        self.problems.append(f"{where}{f' @ token {offset}' if offset is not None else ''}: {message}")

    def problems_at(self, where: str, message: str, offsets: np.ndarray) -> None:
        """Report the first few offsets where a check failed, and how many there were."""
        for offset in offsets[:MAX_REPORTED].tolist():
            self.problem(where, message, offset)
        if len(offsets) > MAX_REPORTED:
            self.problem(where, f"{message}: {len(offsets) - MAX_REPORTED} more like this")


@dataclass
class _Checks:
    """What the optional tokenizer lets us check: ids below the vocabulary size, EOS at document ends."""

    vocab_size: int | None = None
    eos_id: int | None = None


def verify(url: str, tokenizer: str | None = None, eos_token: str | None = None) -> Report:
    """Check every token file directly inside ``url``; a problem-free report means the folder is usable."""
    report = Report()
    checks = _Checks()
    if tokenizer:
        encoder = Encoder(tokenizer, eos_token, no_eos=eos_token is None)
        checks = _Checks(encoder.vocab_size, encoder.eos_id)
    fs, path = open_fs(url)
    sizes = list_sizes(fs, path)  # one listing answers every existence and size question (a HEAD each on S3)
    names = set(sizes)
    described = manifest.output_entries(url)
    ds_files, bin_files = token_file_names(names, (DS,)), token_file_names(names, (MEGATRON,))
    if not ds_files and not bin_files:
        report.problem(url, "no .ds or .bin files")
    _check_completeness(fs, path, url, {*ds_files, *bin_files}, described, report)
    for name in ds_files:
        _verify_ds(fs, join(path, name), join(url.rstrip("/"), name), described.get(name), sizes, checks, report)
    for name in bin_files:
        _verify_megatron(fs, join(url.rstrip("/"), name), described.get(name), sizes, checks, report)
    _verify_dataset_metadata(fs, path, sizes, report)
    return report


def _check_completeness(fs, path: str, url: str, families: set[str], described: dict, report: Report) -> None:
    """Every family a manifest lists is there, every family there is listed, and every stage manifest is complete
    (its marker exists and names its checksum) and adds up to its outputs."""
    stages = _stage_manifests(fs, path)
    if not stages:
        report.notes.append(f"{url}: no manifests, so which files belong here cannot be checked")
        return
    for name in sorted(set(described) - families):
        report.problem(join(url.rstrip("/"), name), f"listed in {_source(described[name])} but missing")
    for name in sorted(families - set(described)):
        report.problem(
            join(url.rstrip("/"), name),
            "no manifest lists this file family: a leftover of another run, or the output of a stage that did "
            "not finish",
        )
    markers = manifest.completion_markers(fs, path)
    for stem, (data, record) in sorted(stages.items()):
        where = join(url.rstrip("/"), manifest.manifest_name(stem))
        marker = markers.get(stem)
        if marker is None:
            report.problem(where, "has no completion marker: its stage did not finish")
        elif marker.get("sha256") != hashlib.sha256(data).hexdigest():
            report.problem(where, "differs from the checksum its completion marker records")
        counts = record.get("counts", {})
        said = counts.get("tokens_written", counts.get("tokens"))
        held = sum(entry["tokens"] for entry in record["outputs"])
        if said != held:
            report.problem(where, f"counts {said} tokens written, its outputs list {held}")


def _stage_manifests(fs, path: str) -> dict[str, tuple[bytes, dict]]:
    """The manifests of whole stages (a rank, a merge, a context shard) with their bytes, by stem; the merge's
    per-file checkpoints are listed by its manifest and have no marker of their own."""
    folder = join(path, "_manifests")
    stages = {}
    for name in list_names(fs, folder):
        if name.endswith(".json"):
            data = fs.cat_file(join(folder, name))
            record = orjson.loads(data)
            if "outputs" in record:
                stages[name.removesuffix(".json")] = (data, record)
    return stages


def _source(entry: dict) -> str:
    owner = entry["_manifest"]
    stem = owner.get("save_filename") or owner.get("params", {}).get("save_filename")
    return f"the {owner.get('stage', 'stage')} manifest{f' of {stem}' if stem else ''}"


def _verify_ds(
    fs, path: str, label: str, entry: dict | None, sizes: dict[str, int], checks: _Checks, report: Report
) -> None:
    """One ``.ds`` family; ``sizes``: its folder's files by name, from the listing."""
    report.files += 1
    name = path.rsplit("/", 1)[-1]
    size = sizes[name]
    meta = None
    if name + ".metadata" in sizes:
        try:
            meta = Metadata.parse(fs.cat_file(path + ".metadata").decode("utf-8"), f"{label}.metadata")
        except (TokenFileError, UnicodeDecodeError) as exc:
            report.problem(f"{label}.metadata", str(exc))
    else:
        report.problem(f"{label}.metadata", "missing: the token size is unknown")
    if name + ".index" not in sizes:
        report.problem(f"{label}.index", "missing")
        return
    try:
        index = map_array(fs, path + ".index", INDEX_DTYPE, f"{label}.index", sizes[name + ".index"])
        ends = np.asarray(index, dtype=np.int64)
    except TokenFileError as exc:
        report.problem(f"{label}.index", str(exc))
        return
    last = int(ends[-1]) if len(ends) else 0
    token_size = meta.token_size if meta else (size // last if last and size // last in (2, 4) else None)
    if token_size not in (2, 4):
        report.problem(label, f"token size {token_size} is neither 2 nor 4")
        return
    tokens = size // token_size
    if size % token_size or tokens != last:
        report.problem(label, f"{size} bytes of {token_size}-byte tokens, but the index ends at token {last}")
    if meta and meta.token_count != tokens:
        report.problem(f"{label}.metadata", f"says {meta.token_count} tokens, the file holds {tokens}")
    _check_index(ends, label, checks, report)
    _check_counts(entry, tokens, len(ends), label, report)
    hashes = {name: hashlib.sha256()}
    has_loss = name + ".loss" in sizes
    if has_loss and sizes[name + ".loss"] != tokens:
        report.problem(f"{label}.loss", f"{sizes[name + '.loss']} bytes for {tokens} tokens")
    dtype = token_dtype(token_size)
    for offset, block in _blocks(fs, path, dtype, hashes[name]):
        _check_tokens(block, offset, ends, entry, label, checks, report)
    if has_loss:
        loss_hash = hashes.setdefault(name + ".loss", hashlib.sha256())
        for offset, block in _blocks(fs, path + ".loss", LOSS_DTYPE, loss_hash):
            report.problems_at(f"{label}.loss", "loss byte is neither 0 nor 1", offset + np.flatnonzero(block > 1))
    _check_checksums(fs, path.rsplit("/", 1)[0], entry, sizes, hashes, report)
    report.tokens += tokens


def _verify_megatron(
    fs, label: str, entry: dict | None, sizes: dict[str, int], checks: _Checks, report: Report
) -> None:
    report.files += 1
    try:
        mg = MegatronFile(label)
    except TokenFileError as exc:
        report.problem(label, str(exc))
        return
    lengths = mg.lengths.astype(np.int64)
    ends = np.cumsum(lengths)
    size, total = fs.size(mg.bin_path), int(ends[-1]) if len(ends) else 0
    if total * mg.dtype.itemsize != size:
        report.problem(label, f"{size} bytes, but the sequence lengths add up to {total} tokens")
    expected = (ends - lengths) * mg.dtype.itemsize
    report.problems_at(
        mg.url + ".idx", "byte pointer disagrees with the lengths", np.flatnonzero(mg.pointers != expected)
    )
    doc = mg.document_indices
    if len(doc) == 0 or doc[0] != 0 or doc[-1] != len(lengths) or np.any(np.diff(doc) < 0):
        report.problem(mg.url + ".idx", "document indices do not run from 0 to the sequence count")
    report.problems_at(label, "negative sequence length", np.flatnonzero(lengths < 0))
    _check_counts(entry, total, len(lengths), label, report)
    hashes = {mg.bin_path.rsplit("/", 1)[-1]: hashlib.sha256()}
    for offset, block in _blocks(fs, mg.bin_path, mg.dtype, hashes[mg.bin_path.rsplit("/", 1)[-1]]):
        _check_tokens(block, offset, ends, entry, label, checks, report)
    _check_checksums(fs, mg.bin_path.rsplit("/", 1)[0], entry, sizes, hashes, report)
    report.tokens += mg.num_tokens


def _check_counts(entry: dict | None, tokens: int, entries: int, label: str, report: Report) -> None:
    """The tokens and index entries that the manifest records for this family, against the files."""
    if entry is None:
        return
    if entry["tokens"] != tokens:
        report.problem(label, f"holds {tokens} tokens, its manifest says {entry['tokens']}")
    if entry["index_entries"] != entries:
        report.problem(label, f"its index holds {entries} entries, its manifest says {entry['index_entries']}")


def _check_index(ends: np.ndarray, label: str, checks: _Checks, report: Report) -> None:
    if len(ends) and ends[0] < 0:
        report.problem(f"{label}.index", "negative first entry", 0)
    steps = np.diff(ends)
    report.problems_at(f"{label}.index", "entry smaller than the one before", ends[1:][steps < 0])
    if checks.eos_id is not None:
        report.problems_at(f"{label}.index", "empty document", ends[1:][steps == 0])


def _check_tokens(block, offset: int, ends, entry: dict | None, label: str, checks: _Checks, report: Report) -> None:
    """Ids below the vocabulary size, and the EOS before every real document end inside this block."""
    if checks.vocab_size is not None and len(block):
        report.problems_at(
            label,
            f"id beyond the vocabulary of {checks.vocab_size}",
            offset + np.flatnonzero(block >= checks.vocab_size),
        )
    if checks.eos_id is None or not len(block):
        return
    pseudo = (entry or {}).get("pseudo_ends")
    if pseudo == "unknown":
        if offset == 0:
            report.notes.append(f"{label}: EOS not checked (its index mixes document ends with moved chunk ends)")
        return
    lo, hi = np.searchsorted(ends, [offset, offset + len(block)], side="right")
    doc_ends = ends[lo:hi]  # the entries whose last token is in this block
    if pseudo:  # chunk or window boundaries are not document ends
        doc_ends = doc_ends[(doc_ends % pseudo["every"] != 0) | (doc_ends > pseudo["until"])]
    missing = doc_ends[block[doc_ends - 1 - offset] != checks.eos_id]
    report.problems_at(label, f"document ends without EOS {checks.eos_id}", missing)


def _blocks(fs, path: str, dtype: np.dtype, digest) -> Iterator[tuple[int, np.ndarray]]:
    """The file as consecutive arrays of at most BLOCK_BYTES, hashing the bytes on the way."""
    step = BLOCK_BYTES // dtype.itemsize * dtype.itemsize
    offset = 0
    with fs.open(path, "rb", block_size=step) as handle:
        while data := handle.read(step):
            digest.update(data)
            usable = len(data) // dtype.itemsize * dtype.itemsize
            yield offset, np.frombuffer(data[:usable], dtype)
            offset += usable // dtype.itemsize


def _check_checksums(fs, folder: str, entry: dict | None, sizes: dict[str, int], hashes: dict, report: Report) -> None:
    """Sizes and sha256 of every file the manifest lists for this output (the big ones hashed while streamed)."""
    if entry is None:
        return
    for name, info in entry["files"].items():
        path = join(folder, name)
        if name not in sizes:
            report.problem(path, "listed in the manifest but missing")
            continue
        digest = hashes.get(name) or hashlib.sha256(fs.cat_file(path))
        if sizes[name] != info["bytes"] or digest.hexdigest() != info["sha256"]:
            report.problem(path, f"differs from the manifest ({sizes[name]} bytes, sha256 {digest.hexdigest()[:12]}…)")


def _verify_dataset_metadata(fs, path: str, sizes: dict[str, int], report: Report) -> None:
    """A merged dataset's ``{name}.ds.metadata`` (with no ``{name}.ds``) counts the tokens of ``NNN_{name}.ds``."""
    names = set(sizes)
    for meta_name in sorted(n for n in names if n.endswith(".ds.metadata") and n[: -len(".metadata")] not in names):
        stem = meta_name[: -len(".ds.metadata")]
        parts = [n for n in names if n.endswith(f"_{stem}.ds") and n.split("_", 1)[0].isdigit()]
        try:
            meta = Metadata.parse(fs.cat_file(join(path, meta_name)).decode("utf-8"), meta_name)
        except TokenFileError as exc:
            report.problem(join(path, meta_name), str(exc))
            continue
        total = sum(sizes[n] // meta.token_size for n in parts)
        if meta.token_count != total:
            report.problem(
                join(path, meta_name), f"says {meta.token_count} tokens, its {len(parts)} files hold {total}"
            )
