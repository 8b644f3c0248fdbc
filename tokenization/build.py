"""A whole corpus build: the folder layout of one run, the check that rank shards are complete, and the
dataset manifest that declares a build finished.

One run writes under its own folder, ``{output}/{run id}`` with the run id percent-encoded where it holds a
character outside ``A-Za-z0-9_.-~`` (so ``qa:col`` is ``qa%3Acol``, never ``qa-col``'s folder)::

    {run}/_RUN.json   the claim: which run owns the folder, written before anything else
    {run}/ranks/      the tokenize stage's rank files, manifests, quarantine, markers
    {run}/merged/     the merge's output
    {run}/context/    the context-window shuffle's output (absent when the window is 0)
    {run}/_BUILD.json the dataset manifest, written last: its presence means the build is complete
"""

from __future__ import annotations

import hashlib
import time
from collections import Counter
from dataclasses import dataclass
from urllib.parse import quote

import orjson

from tokenization import manifest
from tokenization.errors import UsageError
from tokenization.storage import join, list_names, list_sizes, open_fs, put_if, write_bytes_atomic

BUILD_FORMAT = "corpus-tokenization/build/1"
BUILD_MANIFEST = "_BUILD.json"
RUN_CLAIM = "_RUN.json"
DATASET_NAME = "corpus"


class BuildError(RuntimeError):
    """A build cannot go on: its folder belongs to another run, or its stages disagree about what they hold."""


def run_folder(output: str, run_id: str) -> str:
    """The folder of one run: one folder per run id, and one run id per folder. Characters outside
    ``A-Za-z0-9_.-~`` (and a leading dot) are percent-encoded, which no other run id can spell."""
    if not run_id or run_id in (".", ".."):
        raise UsageError(f"run id {run_id!r} cannot name a folder")
    name = quote(run_id, safe="")
    return join(output, "%2E" + name[1:] if name.startswith(".") else name)


def claim_run_folder(run_dir: str, run_id: str) -> None:
    """Make the folder this run's before anything is written, or refuse: a folder claimed by another run, or
    holding files that no run claims, is never written into (a retry of this run finds its own claim)."""
    fs, path = open_fs(run_dir)
    claim = join(path, RUN_CLAIM)
    owner = manifest.read_json(fs, claim)
    if owner is None:
        if found := sorted(list_names(fs, path)):
            raise BuildError(
                f"{run_dir} already holds {', '.join(found[:5])}{' ...' if len(found) > 5 else ''}, which no run "
                f"claims: choose another output, or remove that folder"
            )
        try:
            put_if(fs, claim, orjson.dumps({"run_id": run_id, "claimed": time.time()}), absent=True)
            return
        except FileExistsError:  # another task claimed it a moment ago: see whose claim it is
            owner = manifest.read_json(fs, claim) or {}
    if owner.get("run_id") != run_id:
        raise BuildError(
            f"{run_dir} holds the output of run {owner.get('run_id')!r}, not of {run_id!r}: two runs never share a "
            f"folder; trigger this run under another run id or output"
        )


@dataclass(frozen=True)
class Layout:
    run_dir: str

    @property
    def ranks(self) -> str:
        return join(self.run_dir, "ranks")

    @property
    def merged(self) -> str:
        return join(self.run_dir, "merged")

    @property
    def context(self) -> str:
        return join(self.run_dir, "context")

    @property
    def manifest(self) -> str:
        return join(self.run_dir, BUILD_MANIFEST)


def rank_stem(rank: int) -> str:
    return f"{rank:05d}"


def incomplete_ranks(ranks_dir: str, num_ranks: int) -> dict[int, str]:
    """Every rank of ``0..num_ranks-1`` whose shard is not complete yet, with the reason. A shard is complete when
    its marker exists, its manifest has the checksum the marker records, and every file the marker lists is there
    with its size (one listing of the folder). A marker of a rank outside the run is an error, never ignored."""
    fs, path = open_fs(ranks_dir)
    markers = manifest.completion_markers(fs, path)
    expected = {rank_stem(rank): rank for rank in range(num_ranks)}
    if strangers := sorted(set(markers) - set(expected)):
        raise BuildError(f"{ranks_dir} holds shards that are not ranks of this {num_ranks}-rank run: {strangers}")
    sizes = {**list_sizes(fs, path), **_prefixed(fs, path, "_quarantine")}
    status = {rank: _shard_status(fs, path, markers.get(stem), sizes) for stem, rank in expected.items()}
    return {rank: why for rank, why in status.items() if why is not None}


def _prefixed(fs, path: str, folder: str) -> dict[str, int]:
    return {f"{folder}/{name}": size for name, size in list_sizes(fs, join(path, folder)).items()}


def _shard_status(fs, path: str, marker: dict | None, sizes: dict[str, int]) -> str | None:
    if marker is None:
        return "no completion marker"
    try:
        data = fs.cat_file(join(path, marker["manifest"]))
    except FileNotFoundError:
        return "completion marker without a manifest"
    if hashlib.sha256(data).hexdigest() != marker.get("sha256"):
        return "manifest does not match its completion marker"
    for name, info in marker.get("files", {}).items():
        if sizes.get(name) != info["bytes"]:
            return f"{name} is missing or not the size its completion marker records"
    return None


def conservation(rank_manifests: list[dict]) -> dict:
    """Documents in = documents out + empty + quarantined, summed over the ranks."""
    totals: Counter = Counter()
    rejected: Counter = Counter()
    for m in rank_manifests:
        c = m["counts"]
        totals.update({k: c[k] for k in ("docs_read", "docs_written", "empty", "tokens", "tokens_written")})
        totals["tokens_dropped"] += c["tokens_dropped"]
        rejected.update(c["rejected"])
    quarantined = sum(rejected.values())
    return {
        "docs_in": totals["docs_read"],
        "docs_out": totals["docs_written"],
        "empty": totals["empty"],
        "quarantined": quarantined,
        "rejected_by_reason": dict(sorted(rejected.items())),
        "tokens": totals["tokens_written"],
        "tokens_dropped": totals["tokens_dropped"],
        "holds": totals["docs_read"] == totals["docs_written"] + totals["empty"] + quarantined,
    }


def stage_counts(folder: str) -> dict | None:
    """The counts of every completed stage manifest of a folder (the merge's one, or all context shards'),
    summed; None when the folder holds none."""
    fs, path = open_fs(folder)
    totals: Counter = Counter()
    markers = manifest.completion_markers(fs, path)
    for marker in markers.values():
        counts = (manifest.read_json(fs, join(path, marker["manifest"])) or {}).get("counts", {})
        totals.update({k: v for k, v in counts.items() if isinstance(v, int)})
    return dict(totals) if markers else None


def token_flow(rank_tokens: int, stages: dict[str, dict | None], dataset_tokens: int) -> dict[str, int]:
    """Tokens from stage to stage: what each stage was given = what it wrote + what it dropped, and the dataset's
    files hold what the last stage wrote. A stage that does not add up raises, naming it: a leftover file merged
    in, or a file lost on the way, must never pass for a build."""
    flow = {"tokenize": rank_tokens}
    given = rank_tokens
    for stage, counts in stages.items():
        if counts is None:
            continue
        if counts["tokens"] + counts["tokens_dropped"] != given:
            raise BuildError(
                f"{stage} wrote {counts['tokens']} tokens and dropped {counts['tokens_dropped']}, but was given {given}"
            )
        flow[stage] = given = counts["tokens"]
    if dataset_tokens != given:
        raise BuildError(f"the dataset's files hold {dataset_tokens} tokens, its manifests say {given}")
    return flow


def rank_manifests(ranks_dir: str, num_ranks: int) -> list[dict]:
    fs, path = open_fs(ranks_dir)
    return [manifest.read_json(fs, manifest.manifest_path(path, rank_stem(r))) for r in range(num_ranks)]


def write_build_manifest(layout: Layout, record: dict) -> dict:
    """Declare the build complete: the dataset manifest is written atomically and last."""
    data = {"format": BUILD_FORMAT, **record}
    fs, path = open_fs(layout.manifest)
    write_bytes_atomic(fs, path, orjson.dumps(data, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS))
    return data


def dataset_digest(dataset: str) -> str:
    """One sha256 for a whole dataset, from the checksums its manifests record: equal digests, equal bytes."""
    entries = manifest.output_entries(dataset)
    pairs = sorted((name, info["sha256"]) for entry in entries.values() for name, info in entry["files"].items())
    return hashlib.sha256(orjson.dumps(pairs)).hexdigest()


def latest_build(folder: str) -> dict:
    """The most recent complete build under a builds folder (the newest ``_BUILD.json``)."""
    fs, path = open_fs(folder)
    found = fs.glob(join(path, "*", BUILD_MANIFEST))
    if not found:
        raise FileNotFoundError(f"{folder}: no complete build ({BUILD_MANIFEST}) found")
    newest = max(found, key=lambda p: fs.info(p).get("mtime") or fs.info(p).get("LastModified") or 0)
    return orjson.loads(fs.cat_file(newest))


def summary(build: dict) -> str:
    """A few lines for a person: where the dataset is, how much is in it, and whether it verified."""
    c = build["conservation"]
    lines = [
        f"dataset: {build['dataset']}",
        f"digest:  {build['digest']} (sha256 of the files' checksums: equal digests, equal bytes)",
        f"documents: {c['docs_in']} read = {c['docs_out']} written + {c['empty']} empty + {c['quarantined']} "
        f"quarantined ({'holds' if c['holds'] else 'DOES NOT HOLD'})",
        f"tokens: {build['tokens']} in {len(build['files'])} files, {c['tokens_dropped']} dropped",
        f"verify: {'passed' if build['verify']['ok'] else 'FAILED'} ({build['verify']['files']} files)",
    ]
    if "report" in build:  # the run folder holds the dataset's folder and the report
        lines.append(f"report: {join(build['dataset'].rsplit('/', 1)[0], build['report']['html'])}")
    return "\n".join(lines)


if __name__ == "__main__":  # python -m tokenization.build BUILDS_FOLDER: the summary of the newest build
    import sys

    print(summary(latest_build(sys.argv[1])))
