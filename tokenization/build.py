"""A whole corpus build: the folder layout of one run, the check that rank shards are complete, and the
dataset manifest that declares a build finished.

One run writes under its own folder::

    {run}/ranks/      the tokenize stage's rank files, manifests, quarantine, markers
    {run}/merged/     the merge's output
    {run}/context/    the context-window shuffle's output (absent when the window is 0)
    {run}/_BUILD.json the dataset manifest, written last: its presence means the build is complete
"""

from __future__ import annotations

import hashlib
from collections import Counter
from dataclasses import dataclass

import orjson

from tokenization import manifest
from tokenization.storage import join, open_fs, write_bytes_atomic

BUILD_FORMAT = "corpus-tokenization/build/1"
BUILD_MANIFEST = "_BUILD.json"
DATASET_NAME = "corpus"


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


def rank_status(ranks_dir: str, rank: int) -> str | None:
    """``None`` when the rank's shard is complete and its manifest checks out, else why not."""
    fs, path = open_fs(ranks_dir)
    stem = rank_stem(rank)
    marker = manifest.read_json(fs, manifest.marker_path(path, stem))
    if marker is None:
        return "no completion marker"
    try:
        data = fs.cat_file(manifest.manifest_path(path, stem))
    except FileNotFoundError:
        return "completion marker without a manifest"
    if hashlib.sha256(data).hexdigest() != marker.get("sha256"):
        return "manifest does not match its completion marker"
    for output in orjson.loads(data)["outputs"]:
        for name, info in output["files"].items():
            file = join(path, name)
            if not fs.exists(file) or fs.size(file) != info["bytes"]:
                return f"{name} is missing or not the size its manifest records"
    return None


def incomplete_ranks(ranks_dir: str, num_ranks: int) -> dict[int, str]:
    """Every rank whose shard is not complete yet, with the reason."""
    status = {rank: rank_status(ranks_dir, rank) for rank in range(num_ranks)}
    return {rank: why for rank, why in status.items() if why is not None}


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
