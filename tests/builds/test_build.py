"""A build's folder belongs to one run, reads only what that run's ranks wrote, and adds up token for token."""

from __future__ import annotations

import logging
import os
import pstats
import re
import shutil
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path

import orjson
import pytest

from tests.support.builds import config_of, in_process
from tests.support.processes import cli
from tests.support.s3 import ON_BOTH_STORES
from tests.support.stages import merged, run
from tokenization.builds.accounting import (
    conservation,
    dataset_digest,
    incomplete_ranks,
    rank_manifests,
    stage_counts,
    token_flow,
)
from tokenization.builds.config import BuildConfig
from tokenization.builds.run import BUILD_LEASE, Build, _longest_first
from tokenization.errors import AttemptConflict, UsageError
from tokenization.formats.ds import TokenFileError
from tokenization.output import manifest
from tokenization.output.leases import leased, new_holder
from tokenization.output.runs import BuildError, Layout, claim, folder_for
from tokenization.records import (
    BuildParams,
    ContextCounts,
    MergeCounts,
    PlannedInputs,
    PlannedTokenizer,
    PlanRecord,
    StageSummary,
    TokenizeSummary,
)
from tokenization.storage.folder import Folder


def test_a_worker_writes_its_profile_where_asked(tmp_path, sample_corpus, sample_tokenizer, monkeypatch) -> None:
    """Issue 52, 6: with TOKENIZATION_PROFILE naming a folder, each step a worker process runs leaves its cProfile
    statistics there (py-spy does not follow the fork server's workers); the bytes are a build's without it. The
    first rank runs in the build's own process, which has planned while the fork server imported: it starts at
    once, and the second in a worker."""
    from tokenization.builds import workers

    monkeypatch.setenv(workers.PROFILE, str(tmp_path / "profiles"))
    profiled = Build.start(config_of(sample_corpus, tmp_path, sample_tokenizer), "profiled").run(parallel=2)
    names = sorted(p.name.rsplit("-", 1)[0] for p in (tmp_path / "profiles").glob("*.prof"))
    assert names == ["tokenize-0", "tokenize-1"]  # the ranks (a context window of 0: no shards)
    pids = {p.name.rsplit("-", 1)[0]: int(p.stem.rsplit("-", 1)[1]) for p in (tmp_path / "profiles").glob("*.prof")}
    assert pids["tokenize-0"] == os.getpid() != pids["tokenize-1"]
    (rank,) = (tmp_path / "profiles").glob("tokenize-0-*.prof")
    profile = pstats.Stats(str(rank)).stats  # type: ignore[attr-defined]  # typeshed leaves out Stats' table
    assert any(name == "tokenize_rank" for _, _, name in profile)
    monkeypatch.delenv(workers.PROFILE)
    plain = Build.start(config_of(sample_corpus, tmp_path / "plain", sample_tokenizer), "plain").run(parallel=2)
    assert profiled.record.digest == plain.record.digest


def test_a_rank_failed_in_the_build_process_is_raised_once_the_workers_ranks_end(
    tmp_path, sample_corpus, sample_tokenizer, monkeypatch
) -> None:
    """The build's own process runs the first rank beside the workers: its failure lets the workers' ranks under way
    finish, takes no rank that has not started (each is taken when a process is free), and is what the build
    raises."""
    build = Build.start(config_of(sample_corpus, tmp_path, sample_tokenizer, num_ranks=3), "failing")
    first = _longest_first({rank: build.plan.share(rank, 3) for rank in build.ranks})[0]
    staging = Path(build.layout.run_dir) / "ranks" / ".staging"

    def failing(self, rank, progress=None, owner=None):  # in this process only: the workers run their own code
        assert rank == first
        deadline = time.monotonic() + 60
        while not (staging.exists() and any(staging.iterdir())):  # fails once the worker's rank is under way
            assert time.monotonic() < deadline, "the worker's rank never started"
            time.sleep(0.005)
        raise BuildError(f"rank {rank} failed here")

    monkeypatch.setattr(Build, "tokenize", failing)
    with pytest.raises(BuildError, match=f"^rank {first} failed here$"):
        build.run(parallel=2)
    done = list((Path(build.layout.run_dir) / "ranks" / "_completions").glob("*.json"))
    assert len(done) == 1  # the worker's rank, finished; the third was never started


def test_run_ids_map_to_folders_one_to_one() -> None:
    """Finding 2: ':' and '+' both became '-', so 'qa:col' and 'qa-col' shared a folder. Issue 54: the folders were
    percent-encoded instead, and their file:// links encoded twice; a run id respelt carries its hash."""
    ids = ["qa-col", "qa:col", "qa+col", "qa%3Acol", "scheduled__2026-11-30T02:00:00+00:00", ".hidden", "a~b"]
    folders = [folder_for("/builds", run_id) for run_id in ids]
    assert len(set(folders)) == len(ids)
    assert folders[:3] == ["/builds/qa-col", "/builds/qa-col~61920a57", "/builds/qa-col~d6a97b29"]
    assert folders[4] == "/builds/scheduled__2026-11-30T02-00-00-00-00~278ed946"
    assert folders[5] == "/builds/-hidden~16924190" and folders[6] == "/builds/a-b~941528e5"
    assert all(re.fullmatch(r"/builds/[A-Za-z0-9_.~-]+", folder) for folder in folders)  # nothing to escape
    for bad in ["", ".", ".."]:
        with pytest.raises(UsageError, match="cannot name a folder"):
            folder_for("/builds", bad)


def plan_of(seed: int) -> PlanRecord:
    """A plan of no input files, told apart by its seed."""
    return PlanRecord(
        params=BuildParams.of({}),
        seed=seed,
        tokenizer=PlannedTokenizer(sha256="x", eos_token=None),
        rendering_sha256=None,
        inputs=PlannedInputs(files=[], skipped=[], hidden=0),
    )


def test_a_folder_of_another_run_is_refused(tmp_path) -> None:
    folder = Folder(str(tmp_path / "run"))
    made = claim(folder, "nightly", plan_of(1))
    assert claim(folder, "nightly", plan_of(2)) == made  # a retry of the same run finds the plan it made first
    with pytest.raises(BuildError, match=r"holds the output of run 'nightly', not of 'manual': two runs never share"):
        claim(folder, "manual", plan_of(1))
    (tmp_path / "unclaimed").mkdir()
    (tmp_path / "unclaimed" / "ranks").mkdir()
    with pytest.raises(BuildError, match=r"unclaimed already holds ranks, which no run claims"):
        claim(Folder(str(tmp_path / "unclaimed")), "manual", plan_of(1))


@pytest.fixture
def three_then_two(tmp_path, sample_corpus, sample_tokenizer):
    """Finding 2's worst case: a 3-rank run, then a 2-rank run into the same folder."""
    ranks = tmp_path / "ranks"
    for rank in range(3):
        run([sample_corpus], ranks, sample_tokenizer, rank=rank, world_size=3, seed=5)
    for rank in range(2):
        run([sample_corpus], ranks, sample_tokenizer, rank=rank, world_size=2, seed=5)
    return ranks


def test_a_leftover_rank_is_never_merged(tmp_path, three_then_two) -> None:
    with pytest.raises(BuildError, match=r"not ranks of this 2-rank run: \['00002'\]"):
        incomplete_ranks(Folder(str(three_then_two)), 2)
    (three_then_two / "_completions" / "00002.json").unlink()  # an unfinished attempt leaves files, no marker
    with pytest.raises(TokenFileError, match=r"00002_00000_doc_shuffled.ds: no completion marker lists it"):
        merged(three_then_two, tmp_path / "merged", seed=5)
    assert incomplete_ranks(Folder(str(three_then_two)), 2) == {}


def test_tokens_must_add_up_from_stage_to_stage(tmp_path, sample_corpus, sample_tokenizer) -> None:
    """Finding 2's symptom: 16,729 tokens published while the ranks' own tally counted 3."""
    for rank in range(2):
        run([sample_corpus], tmp_path / "ranks", sample_tokenizer, rank=rank, world_size=2, seed=5)
    merged(tmp_path / "ranks", tmp_path / "merged", seed=5)
    layout = Layout(Folder(str(tmp_path)))
    manifests = rank_manifests(layout.ranks, 2)
    ranks_total = sum(m.counts.tokens_written for m in manifests)
    stages = StageSummary(
        tokenize=TokenizeSummary(ranks=2, input_files=4, **asdict(conservation(manifests))),
        merge=stage_counts(layout.merged, MergeCounts),
        context_shuffle=stage_counts(layout.context, ContextCounts),
    )
    assert stages.context_shuffle is None
    assert token_flow(ranks_total, stages, ranks_total) == {"tokenize": ranks_total, "merge": ranks_total}
    with pytest.raises(BuildError, match=f"merge wrote {ranks_total} tokens and dropped 0, but was given 3"):
        token_flow(3, stages, ranks_total)
    with pytest.raises(BuildError, match=f"the dataset's files hold 16729 tokens, its manifests say {ranks_total}"):
        token_flow(ranks_total, stages, 16_729)


def test_a_copied_in_family_is_not_read(tmp_path, sample_corpus, sample_tokenizer) -> None:
    run([sample_corpus], tmp_path / "ranks", sample_tokenizer, seed=5)
    run([sample_corpus], tmp_path / "other", sample_tokenizer, seed=6, save_filename="x")
    for path in (tmp_path / "other").glob("x_*.ds*"):
        shutil.copy(path, tmp_path / "ranks" / path.name)
    with pytest.raises(TokenFileError, match=r"ranks/x_00000_00000_doc_shuffled.ds: no completion marker lists it"):
        manifest.token_files(Folder(str(tmp_path / "ranks")))
    marker = orjson.loads((tmp_path / "ranks" / "_completions" / "00000.json").read_bytes())
    assert sorted(marker["files"]) == sorted(p.name for p in (tmp_path / "ranks").glob("00000_*"))


def test_a_whole_build_without_airflow(tmp_path, sample_corpus, sample_tokenizer, caplog) -> None:
    """``Build.run``: ranks as processes, merge, context shards, publish, with their progress summed into one bar
    (here: log lines); the same params give the same digest under any build id, and running a build again keeps
    its complete ranks (those of a build that keeps its intermediate files: see tests/builds/test_footprint.py)."""
    from tokenization.builds.config import BuildConfig
    from tokenization.builds.run import Build

    config = BuildConfig(
        input=str(sample_corpus),
        output=str(tmp_path),
        tokenizer=str(sample_tokenizer),
        seed=7,
        num_ranks=3,
        save_loss=True,
        context_window=1025,
        num_context_shards=2,
        merge_max_tokens_per_file=20_000,
        keep_intermediate=True,
    )
    caplog.set_level(logging.INFO, logger="tokenization.progress")
    first = Build.start(config, "first").run(parallel=2, progress=1e-9)
    assert first.record.footprint is not None
    done = [r.getMessage() for r in caplog.records if r.name == "tokenization.progress" and "done in" in r.message]
    assert [line.split(", ")[:3] for line in done] == [  # every rank's documents and tokens, relayed and summed
        ["tokenize: 3 ranks: 100.0% of 93.2 kB", "308 docs", "64,522 tokens"],
        ["merge corpus: 100.0% of 64,522 tok", "308 units", "64,522 tokens"],
        ["context shuffle: 2 shards: 100.0% of 64,522 tok", "65 units", "64,522 tokens"],
    ]
    summary = first.summary()
    assert (summary.verified, summary.docs, summary.rejects, summary.files, summary.tokens) == (True, 308, 0, 4, 64_522)
    record = orjson.loads((tmp_path / "first" / "_BUILD.json").read_bytes())
    assert record == first.record.to_json() and record["dataset"] == str(tmp_path / "first" / "context")
    assert record["inputs"] == {
        "spec": str(sample_corpus),
        "files": 4,
        "bytes": 93_196,
        "skipped": 0,
        "hidden": 0,
        "arrived_after_plan": {"files": 0, "first": []},
    }
    assert record["wall_seconds"] > 0 and record["started"] <= record["finished"]
    assert "storage_options" not in record["params"] and record["params"]["num_ranks"] == 3
    assert (tmp_path / "first" / "report.html").exists()
    assert summary.to_json() == {
        "format": "corpus-tokenization/build-summary/3",
        "dataset": first.record.dataset,
        "digest": first.record.digest,
        "tokens": 64_522,
        "docs": 308,
        "rejects": 0,
        "files": 4,
        "verified": True,
        "seed": 7,
        "tokenizer": str(sample_tokenizer),
        "input": str(sample_corpus),
        "latest": str(tmp_path / "first"),
        "deleted": [],
        "reused": 0.0,  # the first build: nothing in its cache yet
        "footprint": first.record.footprint.to_json(),
        "started": record["started"],  # the build's, plan to publish, for the builds page
        "wall_seconds": record["wall_seconds"],
    }

    assert Build.start(config, "second").run(parallel=1).record.digest == first.record.digest
    markers = tmp_path / "first" / "ranks" / "_completions"
    kept = {p.name: p.read_bytes() for p in markers.iterdir()}
    (markers / "00001.json").unlink()  # rank 1 did not finish, so the build was not published
    (tmp_path / "first" / "_BUILD.json").unlink()
    again = Build.start(config, "first").run(parallel=2)
    assert again.record.digest == first.record.digest
    redone = {p.name: p.read_bytes() for p in markers.iterdir()}
    assert {k: v for k, v in redone.items() if k != "00001.json"} == {
        k: v for k, v in kept.items() if k != "00001.json"
    }
    assert redone["00001.json"] != kept["00001.json"]  # a new attempt wrote it

    # Rank 2 did not finish and rank 0's manifest was damaged since: the damage shows only once rank 2 has its
    # marker, and the same run tokenizes rank 0 again then, rather than failing and asking for another resume.
    (markers / "00002.json").unlink()
    (tmp_path / "first" / "_BUILD.json").unlink()
    damaged = tmp_path / "first" / "ranks" / "_manifests" / "00000.json"
    damaged.write_bytes(damaged.read_bytes().replace(b'"counts"', b'"counts" ', 1))
    caplog.clear()
    assert Build.start(config, "first").run(parallel=1).record.digest == first.record.digest
    assert (markers / "00000.json").read_bytes() != redone["00000.json"]
    said = [r.getMessage() for r in caplog.records if "tokenized again" in r.getMessage()]
    assert len(said) == 1 and said[0].startswith("rank 0 is tokenized again: ") and "00000.json" in said[0], said


def test_while_a_marker_is_missing_the_check_is_one_listing(tmp_path, sample_corpus, sample_tokenizer, monkeypatch):
    """The sensor pokes every few seconds for thousands of ranks: no marker is read until all are listed."""
    run([sample_corpus], tmp_path / "ranks", sample_tokenizer, rank=0, world_size=2, seed=5)
    complete = incomplete_ranks(Folder(str(tmp_path / "ranks")), 1)
    monkeypatch.setattr(manifest, "completion_markers", lambda *_: pytest.fail("markers read while one is missing"))
    assert incomplete_ranks(Folder(str(tmp_path / "ranks")), 2) == {1: "no completion marker"}
    assert complete == {}


def test_a_build_says_once_which_input_files_it_skips_and_that_ranks_will_idle(
    tmp_path, sample_corpus, sample_tokenizer, caplog
) -> None:
    """Each task that listed the input said it again: five times in a DAG run. A rank with no file said only
    "0 tokens in 0 files"."""
    from tests.support.builds import in_process
    from tokenization.builds.config import BuildConfig
    from tokenization.builds.run import Build

    shutil.copytree(sample_corpus, tmp_path / "in")
    (tmp_path / "in" / "notes.txt").write_text("not a corpus file")
    config = BuildConfig(
        input=str(tmp_path / "in"), output=str(tmp_path / "out"), tokenizer=str(sample_tokenizer), num_ranks=6
    )
    record = in_process(Build.start(config, "b")).record
    assert record.inputs.skipped == 1
    said = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert said == [
        f"skipped 1 input file of unsupported types: {tmp_path / 'in' / 'notes.txt'}",
        "6 ranks for 4 input files: a rank takes whole files, so 2 ranks will have nothing to tokenize; use at most "
        "4 ranks, or split the input into more files (ranks cannot share a compressed file)",  # and nothing more
    ]


def test_a_tokenizer_path_is_written_as_typed_and_gives_one_digest_however_typed(
    tmp_path, sample_corpus, sample_tokenizer, monkeypatch
):
    """datatrove's metadata names the tokenizer as given: relative, absolute, through a symlink (a Hugging Face hub
    cache is links to blobs), each its own first line. The digest names it by its sha256, so the three builds have
    one digest, which verify finds again."""
    monkeypatch.chdir(sample_tokenizer.parent.parent)
    (tmp_path / "link").symlink_to(sample_tokenizer.parent, target_is_directory=True)
    typed = {
        "relative": f"{sample_tokenizer.parent.name}/./{sample_tokenizer.name}",
        "absolute": str(sample_tokenizer),
        "symlink": str(tmp_path / "link" / sample_tokenizer.name),
    }
    digests = {}
    for how, tokenizer in typed.items():
        config = config_of(sample_corpus, tmp_path / how, tokenizer, context_window=64)
        digests[how] = in_process(Build.start(config, "typed")).record.digest
        run_dir = tmp_path / how / "out" / "typed"
        firsts = {p.read_text().split("\n")[0] for p in (run_dir / "context").glob("*.ds.metadata")}
        assert firsts == {f"{tokenizer}|2"}
        verified = cli("verify", str(run_dir))
        assert verified.returncode == 0, verified.stdout
    assert digests["relative"] == digests["absolute"] == digests["symlink"]


def test_verify_takes_the_digest_a_build_published_before_recorded(tmp_path, sample_corpus, sample_tokenizer) -> None:
    """A build published before the digest named the tokenizer by its sha256 recorded the digest of its bytes."""
    in_process(Build.start(config_of(sample_corpus, tmp_path, sample_tokenizer, context_window=64), "old"))
    run_dir = tmp_path / "out" / "old"
    record = orjson.loads((run_dir / "_BUILD.json").read_bytes())
    record["digest"] = dataset_digest(Folder(str(run_dir / "context")), None)
    (run_dir / "_BUILD.json").write_bytes(orjson.dumps(record))
    assert cli("verify", str(run_dir)).returncode == 0
    record["digest"] = "0" * 64
    (run_dir / "_BUILD.json").write_bytes(orjson.dumps(record))
    refused = cli("verify", str(run_dir))
    assert refused.returncode == 1 and f"records {record['tokens']:,} tokens and digest {'0' * 64}" in refused.stdout


def test_publish_leaves_no_staging_behind(tmp_path, sample_corpus, sample_tokenizer) -> None:
    """An attempt interrupted between its marker and its cleanup leaves its staging folder, and its rank, complete,
    is never run again to remove it: publish removes every stage folder's staging base."""
    from tokenization.builds.config import BuildConfig
    from tokenization.builds.run import Build

    config = BuildConfig(input=str(sample_corpus), output=str(tmp_path), tokenizer=str(sample_tokenizer), seed=3)
    build = Build.start(config, "b")
    build._steps(parallel=1, progress=False)
    left = tmp_path / "b" / "ranks" / ".staging" / "00000.attempt-0123456789ab"
    left.mkdir(parents=True)
    (left / "00000_00000_doc_shuffled.ds").write_bytes(b"half")
    build.publish()
    assert list(tmp_path.rglob(".staging")) == []


def test_a_second_run_of_a_build_steps_aside_naming_the_first(tmp_path, sample_corpus, sample_tokenizer) -> None:
    """Trust 4, finding 12: two runs of one build id at once each took some ranks' leases and removed the markers
    the other wrote, so both failed. The whole run holds the build's lease: the second steps aside at once, in one
    line naming the first, and changes nothing."""
    config = config_of(sample_corpus, tmp_path, sample_tokenizer)
    build = Build.start(config, "same")
    with leased(build.layout.run, BUILD_LEASE, new_holder("first")):
        with pytest.raises(AttemptConflict) as refused:
            Build.start(config, "same").run(progress=False)
        assert not build.layout.ranks.exists()
    assert str(refused.value).startswith(f"{tmp_path}/out/same/.build.lock: attempt ")
    assert "(first, host " in str(refused.value) and "is writing this output" in str(refused.value)
    assert build.run(progress=False).record.run_id == "same"
    assert not (tmp_path / "out" / "same" / ".build.lock").exists()


def test_two_runs_of_one_build_at_once_publish_it_once(tmp_path, sample_corpus, sample_tokenizer) -> None:
    """The same race as the commands a person starts twice: one publishes; the other publishes too (it started
    after) or steps aside in one line. Before the build's lease, both failed in 3 runs of 3 here."""
    args = ["build", str(sample_corpus), "--output", str(tmp_path / "out"), "--tokenizer", str(sample_tokenizer)]
    args += ["--build-id", "same", "--num-ranks", "4", "--parallel", "2", "--seed", "3"]
    with ThreadPoolExecutor(2) as pool:
        done = list(pool.map(lambda _: cli(*args), range(2)))
    assert 0 in [d.returncode for d in done], [d.stderr[-500:] for d in done]
    for other in done:
        if other.returncode:
            error = other.stderr.splitlines()[-1]
            assert other.returncode == 1 and "Traceback" not in other.stderr, other.stderr
            assert error.startswith(f"error: {tmp_path}/out/same/.build.lock: attempt ") and "is writing" in error
    alone = [str(tmp_path / "alone") if arg == str(tmp_path / "out") else arg for arg in args]
    assert cli(*alone).returncode == 0
    records = [orjson.loads((tmp_path / out / "same" / "_BUILD.json").read_bytes()) for out in ("out", "alone")]
    assert records[0]["digest"] == records[1]["digest"]


@ON_BOTH_STORES
def test_a_second_run_of_a_build_on_s3_steps_aside(s3, sample_corpus, sample_tokenizer) -> None:
    """The build's lease on an object store: ``_leases/build.json`` in the run folder, created only if absent."""
    config = BuildConfig(
        input=str(sample_corpus), output="s3://corpus/out", tokenizer=str(sample_tokenizer), storage_options=s3.options
    )
    build = Build.start(config, "same")
    refused = pytest.raises(AttemptConflict, match=r"^corpus/out/same/_leases/build.json: attempt .*\(first, ")
    with leased(build.layout.run, BUILD_LEASE, new_holder("first")), refused:
        Build.start(config, "same").run(progress=False)
    assert build.run(progress=False).record.run_id == "same"
    s3.fs.invalidate_cache()
    assert not s3.fs.exists("corpus/out/same/_leases/build.json")


def race_for_the_build(config: BuildConfig, build_id: str) -> list[str]:
    """Two threads start one build at the same moment, then take its lease at the same moment, holding it until
    both have tried: what each got ("held", or the refusal's message), the holder first."""
    gate = threading.Barrier(2, timeout=30)

    def start(_: int) -> str:
        gate.wait()
        build = Build.start(config, build_id)
        gate.wait()
        try:
            with leased(build.layout.run, BUILD_LEASE, new_holder("racer")):
                gate.wait()
                return "held"
        except AttemptConflict as refused:
            gate.wait()
            return str(refused)

    with ThreadPoolExecutor(2) as pool:
        return sorted(pool.map(start, range(2)), key=lambda outcome: outcome != "held")


@ON_BOTH_STORES
def test_runs_of_one_build_started_at_once_on_s3_claim_once_and_one_holds_it(s3, sample_corpus, sample_tokenizer):
    """Two starts at the same moment: both find the one claim (the same plan), and of two leases taken at once,
    one wins and the other is refused in one line, never a raw store error (the store's refusal of the loser's
    conditional write was its context, and was reported in its place)."""
    config = BuildConfig(
        input=str(sample_corpus), output="s3://corpus/out", tokenizer=str(sample_tokenizer), storage_options=s3.options
    )
    for round in range(4):
        outcomes = race_for_the_build(config, f"same-{round}")
        assert outcomes[0] == "held" and " is writing this output" in outcomes[1], outcomes


@pytest.mark.parametrize(
    ("files", "options", "held"),
    [
        ({"a.jsonl": b"", "b.jsonl": b"\n  \n"}, {}, "2 blank lines and no record"),
        ({"a.jsonl": b""}, {"output_format": "megatron"}, "no record"),
        ({"a.jsonl": b"\n"}, {"num_buckets": 2, "merge_mode": "bucketed"}, "1 blank line and no record"),
    ],
)
def test_an_input_of_empty_or_blank_files_fails_saying_so(tmp_path, sample_tokenizer, files, options, held):
    """A build whose input held no record failed at its merge with "no .ds files to merge" (Megatron's at verify,
    "no .ds or .bin files"; a bucketed one's: "use fewer buckets"), which did not say why; a nightly build that
    published an empty dataset would pass unnoticed. It fails naming its input, its files and what they held;
    nothing is published."""
    inputs = tmp_path / "in"
    inputs.mkdir()
    for name, data in files.items():
        (inputs / name).write_bytes(data)
    config = config_of(inputs, tmp_path, sample_tokenizer, **options)
    build = Build.start(config, "empty")
    with pytest.raises(BuildError) as failed:
        in_process(build)
    size = sum(map(len, files.values()))
    assert str(failed.value) == (
        f"no document was read from the input ({inputs}): its {len(files)} file{'s' if len(files) > 1 else ''} "
        f"({size} bytes) held {held} (empty files, or blank lines only); a build publishes no empty dataset"
    )
    assert not (Path(build.layout.run_dir) / "_BUILD.json").exists()
