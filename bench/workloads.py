"""The work each benchmark row measures, one function a workload, each run alone in a fresh interpreter:

    python -m bench.workloads NAME '{"corpus": ..., "out": ...}'

It prints one JSON line: the seconds the workload took, the process's peak RSS, its CPU seconds with its
descendants' and their largest peak RSS, and (the encoders) the seconds loading the tokenizer took. A fresh process
a run keeps stages from inheriting each other's memory, so this module imports nothing heavy at the top: each
workload imports what it uses, inside the measured time, as a stage does.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing import forkserver
from pathlib import Path
from typing import Any

# As the CLI and the deployment run the stages (``tokenization.cli``, docker-compose.yaml): numpy's OpenBLAS threads,
# which spin after its import and serve no stage, held to one. datatrove's workloads run under the same setting.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")


@dataclass(frozen=True)
class Inputs:
    """What a workload reads and where it writes; each uses the fields of its kind of row."""

    out: str
    corpus: str = ""
    tokenizer: str = ""
    eos: str = ""
    text_key: str = ""
    ranks: str = ""  # a folder of rank files, for merge, context shuffle and verify
    endpoint: str = ""  # the S3 endpoint of ``ranks`` and ``out``, when they are s3:// URLs
    builds: str = ""  # a whole build's output, kept from one night's build to the next (its cache with it)
    build_id: str = ""
    num_ranks: int = 0  # the ranks whose records ``ranks`` holds, for the books
    plan: str = ""  # the plan digest those ranks were made under
    planned: str = ""  # a JSON file of the plan's input files (``InputFile`` records), for publish's books
    documents: int = 0  # the documents Best-Fit Decreasing packs alone
    memory_budget_mb: int = 0  # a rank's memory budget (0: the default)
    mixture: dict | None = None  # a whole build's mixture of sources, in place of ``corpus``


@dataclass(frozen=True)
class OwnTimes:
    """A workload's own timing, where the process's would hide what is measured: the work alone (an encoder's
    encoding, the texts already in memory; publish alone, its imports done), and loading a tokenizer alone."""

    seconds: float
    load_seconds: float | None = None
    counts: dict[str, int] | None = None  # what the work made, where its row reports it (packing: its windows)
    base_rss_mb: float | None = None  # peak RSS before the work, its inputs made in memory: the rest is the work's


WINDOW = 2049  # the context window of the packing rows


def web_lengths(rng: Any, n: int) -> Any:
    """``n`` document lengths in tokens as web text has them: log-normal, median 245, mean ~450, 1.5% over 2,049."""
    import numpy as np

    return np.clip(rng.lognormal(5.5, 1.1, n).astype(np.int64), 1, 100_000)


def ours_tokenize(inputs: Inputs) -> None:
    from tokenization.stages.tokenize import TokenizeConfig, tokenize_rank

    config = TokenizeConfig(
        inputs=[inputs.corpus],
        output=inputs.out,
        tokenizer=inputs.tokenizer,
        text_key=inputs.text_key,
        eos_token=inputs.eos,
        seed=1234,
        local_working_dir=inputs.out + "_work",
        special_text="special",
        **({"memory_budget_mb": inputs.memory_budget_mb} if inputs.memory_budget_mb else {}),
    )
    tokenize_rank(config, progress=False)


def datatrove_tokenize(inputs: Inputs) -> None:
    from datatrove.pipeline.readers import JsonlReader
    from datatrove.pipeline.tokens import DocumentTokenizer

    tokenizer = DocumentTokenizer(inputs.out, tokenizer_name_or_path=inputs.tokenizer, eos_token=inputs.eos, seed=1234)
    _datatrove([JsonlReader(inputs.corpus, text_key=inputs.text_key), tokenizer], inputs)


def ours_count(inputs: Inputs) -> None:
    from tokenization.stages.count import CountConfig, count_tokens

    config = CountConfig(
        inputs=[inputs.corpus],
        tokenizer=inputs.tokenizer,
        text_key=inputs.text_key,
        eos_token=inputs.eos,
        special_text="special",
    )
    count_tokens(config, progress=False)


def datatrove_count(inputs: Inputs) -> None:
    from datatrove.pipeline.readers import JsonlReader
    from datatrove.pipeline.tokens import TokensCounter

    _datatrove([JsonlReader(inputs.corpus, text_key=inputs.text_key), TokensCounter(inputs.tokenizer)], inputs)


def ours_merge(inputs: Inputs) -> None:
    from tokenization.stages.merge import merge
    from tokenization.stages.merge.config import MergeConfig

    merge(MergeConfig(input=inputs.ranks, output=inputs.out, save_filename="m", seed=1))


def datatrove_merge(inputs: Inputs) -> None:
    from datatrove.pipeline.tokens import DocumentTokenizerMerger

    _datatrove([DocumentTokenizerMerger(inputs.ranks, inputs.out, save_filename="m", seed=1, progress=False)], inputs)


def ours_context(inputs: Inputs) -> None:
    from tokenization.stages.context_shuffle import ContextShuffleConfig, context_shuffle

    context_shuffle(ContextShuffleConfig(input=inputs.ranks, output=inputs.out, seed=1, drop_tail=True), progress=False)


def ours_mds(inputs: Inputs) -> None:
    """The 2,049-token windows of ``ranks`` (a context shuffle's output) as MDS shards, each put whole (fsync'd)."""
    from tokenization.stages.export_mds import write_mds
    from tokenization.storage.folder import Folder

    write_mds(Folder(inputs.ranks), Folder(inputs.out), WINDOW, progress=False)


def ours_context_windows(inputs: Inputs) -> OwnTimes:
    """The context shuffle into 2,049-token windows, tail kept; and how many documents a window's edge cuts."""
    import numpy as np

    from tokenization.formats.ds import TokenFile

    start = time.time()
    counts = _context(inputs, "windows")
    seconds = time.time() - start
    documents = cut = 0
    for path in Path(inputs.ranks).glob("*.ds"):
        ends = np.asarray(TokenFile(str(path)).ends, dtype=np.int64)
        documents += len(ends)
        cut += int(np.count_nonzero(np.concatenate([[0], ends[:-1]]) // WINDOW != (ends - 1) // WINDOW))
    return OwnTimes(seconds, counts=counts | {"documents": documents, "documents_cut": cut})


def ours_context_packed(inputs: Inputs) -> OwnTimes:
    """The context shuffle into 2,049-token windows packed by Best-Fit Decreasing (padded with GPT-2's EOS)."""
    start = time.time()
    counts = _context(inputs, "packed", pad_id=50256)
    return OwnTimes(time.time() - start, counts=counts | {"documents_cut": counts["documents_split"]})


def ours_pack(inputs: Inputs) -> OwnTimes:
    """Best-Fit Decreasing alone: ``documents`` of web lengths (made first, untimed) cut into pieces and packed
    into 2,049-token windows, then the windows shuffled: what a packed context task plans."""
    import numpy as np

    from tokenization.formats.packing import pack

    ends = np.cumsum(web_lengths(np.random.default_rng(0), inputs.documents))
    base = peak_rss_mb()
    start = time.perf_counter()
    packed = pack(ends, WINDOW, np.random.default_rng(1))
    seconds = time.perf_counter() - start
    counts = {"pieces": len(packed.pieces.starts), "windows": packed.windows, "padding_tokens": packed.padding_tokens}
    return OwnTimes(seconds, counts=counts | {"documents": inputs.documents}, base_rss_mb=base)


def datatrove_context(inputs: Inputs) -> None:
    from datatrove.pipeline.tokens import DocumentTokenizerContextShuffler

    _datatrove([DocumentTokenizerContextShuffler(inputs.ranks, inputs.out, seed=1)], inputs)


def s3_merge(inputs: Inputs) -> None:
    """The merge, its inputs and output on S3 (``endpoint``)."""
    from tokenization.stages.merge import merge
    from tokenization.stages.merge.config import MergeConfig

    options = {"s3": {"endpoint_url": inputs.endpoint}}
    merge(MergeConfig(input=inputs.ranks, output=inputs.out, save_filename="m", seed=1, storage_options=options))


def s3_context(inputs: Inputs) -> None:
    """The context shuffle, its inputs and output on S3 (``endpoint``)."""
    from tokenization.stages.context_shuffle import ContextShuffleConfig, context_shuffle

    options = {"s3": {"endpoint_url": inputs.endpoint}}
    config = ContextShuffleConfig(input=inputs.ranks, output=inputs.out, seed=1, storage_options=options)
    context_shuffle(config, progress=False)


def ours_verify(inputs: Inputs) -> None:
    from tokenization.stages.verify import verify
    from tokenization.storage.folder import Folder

    if not verify(Folder(inputs.ranks)).ok:
        raise RuntimeError(f"verify found problems in {inputs.ranks}")


def ours_build(inputs: Inputs) -> None:
    """A whole build on this machine, with the tokenization cache of ``builds`` (its default, ``builds/.cache``), as
    ``tokenization build`` runs it: its workers' server started first."""
    from tokenization.builds import forkserver

    forkserver.start()
    _build(inputs).run(parallel=2, progress=False)


def ours_publish(inputs: Inputs) -> OwnTimes:
    """Publish alone, of a build whose stages are done (``ours_build``'s, its ``_BUILD.json`` removed)."""
    build = _build(inputs)
    start = time.perf_counter()
    build.publish()
    return OwnTimes(time.perf_counter() - start)


def ours_reread(inputs: Inputs) -> OwnTimes:
    """What publish did before the stages checked their own files: verify every byte of the build's dataset
    against its tokenizer (ids, EOS), alone."""
    from tokenization.builds import complete
    from tokenization.stages.verify import verify
    from tokenization.storage.folder import Folder

    build = _build(inputs)
    dataset = build.published().record.dataset
    start = time.perf_counter()
    if not verify(Folder(dataset), checks=complete.dataset_checks(build.config, build.claimed)).ok:
        raise RuntimeError(f"verify found problems in {dataset}")
    return OwnTimes(time.perf_counter() - start)


def _build(inputs: Inputs):
    """The build ``build_id`` under ``builds``, as the whole-build rows make it (the same id: the same plan), of
    ``corpus`` or of the ``mixture`` of sources."""
    from tokenization.builds.config import BuildConfig
    from tokenization.builds.run import Build

    config = BuildConfig(
        input=inputs.corpus or None,
        mixture=inputs.mixture,
        output=inputs.builds,
        tokenizer=inputs.tokenizer,
        text_key=inputs.text_key,
        eos_token=inputs.eos,
        seed=1234,
        num_ranks=4,
        num_context_shards=2,
    )
    return Build.start(config, inputs.build_id)


def ours_sensor_books(inputs: Inputs) -> OwnTimes:
    """The sensor's check of a build's ranks alone (``incomplete_ranks``, with the plan, as ``Build`` calls it):
    every marker and manifest read, the rank folder and each bucket folder listed. Every rank must be complete."""
    from tokenization.builds.accounting import incomplete_ranks
    from tokenization.storage.folder import Folder

    start = time.perf_counter()
    if missing := incomplete_ranks(Folder(inputs.ranks), inputs.num_ranks, inputs.plan):
        raise RuntimeError(f"{len(missing)} ranks are not complete, as rank {min(missing)}: {missing[min(missing)]}")
    return OwnTimes(time.perf_counter() - start)


def ours_publish_books(inputs: Inputs) -> OwnTimes:
    """Publish's books alone, as ``complete.build_record`` keeps them: every rank manifest, documents conserved
    against the plan's input files (read first, untimed, as publish holds its plan), and the cache's summary."""
    from tokenization.builds.accounting import cache_summary, conservation, rank_manifests
    from tokenization.records import InputFile
    from tokenization.storage.folder import Folder

    planned = [InputFile.from_json(f, inputs.planned) for f in json.loads(Path(inputs.planned).read_bytes())]
    start = time.perf_counter()
    ranks = rank_manifests(Folder(inputs.ranks), inputs.num_ranks)
    balance = conservation(ranks, planned)
    if not balance.holds or cache_summary(ranks) is None:
        raise RuntimeError(f"the books of {inputs.ranks} do not hold, or its ranks ran without a cache: {balance}")
    return OwnTimes(time.perf_counter() - start)


def hf_encode(inputs: Inputs) -> OwnTimes:
    """HF ``encode_batch_fast`` alone, on every core: the limit of any pipeline built on it."""
    from tokenizers import Tokenizer

    return _encode(
        inputs, lambda: Tokenizer.from_file(inputs.tokenizer), lambda tok, texts: tok.encode_batch_fast(texts)
    )


def gigatoken_encode(inputs: Inputs) -> OwnTimes:
    """gigatoken ``encode_batch`` alone, on every core, to one flat array of ids. Used directly, not through this
    project, so that the limit does not move when the project's own code does."""
    import awkward as ak
    import gigatoken
    import numpy as np

    def load() -> Any:
        return gigatoken.Tokenizer.from_json(Path(inputs.tokenizer).read_bytes())

    return _encode(inputs, load, lambda tok, texts: np.asarray(ak.flatten(tok.encode_batch(texts))))


def _context(inputs: Inputs, mode: str, **options: Any) -> dict[str, int]:
    """A context shuffle of the rank files into 2,049-token windows; its counts."""
    from tokenization.stages.context_shuffle import ContextShuffleConfig, context_shuffle

    config = ContextShuffleConfig(
        input=inputs.ranks, output=inputs.out, seed=1, context_window=WINDOW, context_mode=mode, **options
    )
    counts = context_shuffle(config, progress=False).counts
    return {
        "windows": counts.windows,
        "tokens": counts.tokens,
        "padding_tokens": counts.padding_tokens,
        "documents": counts.documents_whole + counts.documents_split,  # packed windows count their documents
        "documents_split": counts.documents_split,
    }


def _datatrove(pipeline: list, inputs: Inputs) -> None:
    """A datatrove pipeline, then a ``sync``: datatrove never flushes what it writes, where our stages publish
    durably (fsync'd), so it is timed until its files are on disk, as ``cp`` is."""
    from datatrove.executor import LocalPipelineExecutor

    LocalPipelineExecutor(pipeline=pipeline, tasks=1, workers=1, logging_dir=inputs.out + "_logs").run()
    os.sync()


def _encode(inputs: Inputs, load: Callable[[], Any], encode: Callable[[Any, list[str]], Any]) -> OwnTimes:
    """The texts in memory first (read as the stages read them), then loading and encoding timed apart: a stage
    pays the load once per process, so it is reported on its own rather than hidden in the limit."""
    from tokenization.inputs.listing import list_input_files
    from tokenization.inputs.reader import DocumentReader, Record

    reader = DocumentReader(list_input_files([inputs.corpus]).files, inputs.text_key)
    texts = [r.text for r in reader if isinstance(r, Record) and r.text]
    start = time.time()
    tok = load()
    load_seconds = time.time() - start
    start = time.time()
    encode(tok, texts)
    return OwnTimes(time.time() - start, load_seconds)


Workload = Callable[[Inputs], OwnTimes | None]
WORKLOADS: dict[str, Workload] = {
    w.__name__: w
    for w in (
        ours_tokenize,
        datatrove_tokenize,
        ours_count,
        datatrove_count,
        ours_merge,
        datatrove_merge,
        ours_context,
        datatrove_context,
        ours_context_windows,
        ours_context_packed,
        ours_mds,
        ours_pack,
        ours_verify,
        s3_merge,
        s3_context,
        ours_build,
        ours_publish,
        ours_reread,
        ours_sensor_books,
        ours_publish_books,
        hf_encode,
        gigatoken_encode,
    )
}


def peak_rss_mb() -> float:
    """This process's peak RSS. VmHWM, not ru_maxrss: Linux carries ru_maxrss over exec from the parent, VmHWM
    belongs to this image only."""
    status = Path("/proc/self/status").read_text().splitlines()
    return next(int(line.split()[1]) for line in status if line.startswith("VmHWM:")) / 1024


def with_descendants() -> tuple[float, float]:
    """The CPU seconds (user and system) of this process and of every process it started, and the largest peak RSS
    among those (MB; 0 without any). A build's workers are the children of its fork server, which reaps them: the
    server, stopped and waited for here, brings their times with its own. On a loaded machine a wall time says how
    busy the others were; the CPU time says what the work cost."""
    server = getattr(forkserver, "_forkserver", None)
    if server is not None and getattr(server, "_forkserver_pid", None) is not None:
        server._stop()
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime
    return cpu, children.ru_maxrss / 1024


def main(argv: list[str]) -> None:
    name, inputs = argv
    start = time.time()
    times = WORKLOADS[name](Inputs(**json.loads(inputs)))
    seconds = times.seconds if times else time.time() - start
    own = (
        {"load_seconds": times.load_seconds, "counts": times.counts, "base_rss_mb": times.base_rss_mb} if times else {}
    )
    cpu, workers_rss = with_descendants()
    print(json.dumps({"seconds": seconds, "rss_mb": peak_rss_mb(), "cpu_s": cpu, "workers_rss_mb": workers_rss} | own))


if __name__ == "__main__":
    main(sys.argv[1:])
