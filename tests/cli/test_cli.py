"""The command line contract: names, exit codes, one-line errors, summaries and inspect."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlparse
from urllib.request import url2pathname

import pytest

from tests.support.corpus import sample_records, write_jsonl
from tests.support.processes import cli
from tests.support.tokenizers import EOS
from tokenization.formats import native
from tokenization.output.runs import folder_for


def test_tokenize_then_inspect(tmp_path, sample_corpus, sample_tokenizer) -> None:
    out = tmp_path / "out"
    options = ["--seed", "3", "--rank", "1", "--world-size", "2", "--save-filename", "demo", "--save-loss"]
    options += ["--max-tokens-per-file", "20000", "--eos-token", EOS]
    done = cli("tokenize", str(sample_corpus), "--output", str(out), "--tokenizer", str(sample_tokenizer), *options)
    assert done.returncode == 0, done.stderr
    summary = done.stdout.strip().splitlines()[-1]
    assert summary.startswith("rank 1/2: ") and " 0 rejected, " in summary and " 0 dropped, " in summary
    assert sorted(p.name for p in out.glob("*.ds")) == [
        "demo_00001_00000_doc_shuffled.ds",
        "demo_00001_00001_doc_shuffled.ds",
    ]

    shown = cli("inspect", str(out), "--decode", "1")
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert lines[0].startswith(f"{out}/demo_00001_00000_doc_shuffled.ds: ") and "uint16, loss" in lines[0]
    assert lines[2].startswith("total: 2 files, ")
    assert lines[3].startswith(f"--- {out}/demo_00001_00000_doc_shuffled.ds document 0 (")
    assert shown.stdout.rstrip().endswith(EOS)


def test_decode_with_a_tokenizer_the_metadata_names_relative_to_elsewhere_says_to_give_it(
    tmp_path, sample_corpus, sample_tokenizer
) -> None:
    """The metadata names the tokenizer as the build was given it, as datatrove does: a relative path is relative
    to where the build ran."""
    out = tmp_path / "out"
    typed = ["--tokenizer", f"{sample_tokenizer.parent.name}/{sample_tokenizer.name}", "--eos-token", EOS]
    command = [sys.executable, "-m", "tokenization.cli"]
    done = subprocess.run(
        [*command, "tokenize", str(sample_corpus), "--output", str(out), *typed],
        cwd=sample_tokenizer.parent.parent,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    shown = subprocess.run(
        [*command, "inspect", str(out), "--decode", "1"], cwd=tmp_path, capture_output=True, text=True
    )
    assert shown.returncode == 1 and shown.stderr.splitlines()[-1] == (
        "error: sample/tokenizer.json: no such tokenizer file (the metadata names it as the build was given it): give "
        "--tokenizer"
    )


def test_build_names_itself_plainly_prints_a_report_link_that_opens_and_verify_takes_its_folder(
    tmp_path, sample_corpus, sample_tokenizer
) -> None:
    options = ["--output", str(tmp_path), "--tokenizer", str(sample_tokenizer), "--num-ranks", "1"]
    done = cli("build", str(sample_corpus), *options, "--context-window", "0")
    assert done.returncode == 0, done.stderr
    (run_dir,) = [p for p in tmp_path.iterdir() if p.name.startswith("cli")]
    assert re.fullmatch(r"cli-\d{8}T\d{6}Z", run_dir.name)  # the default build id: nothing to percent-encode
    checked = cli("verify", str(run_dir))  # a run folder: its dataset is checked
    assert checked.returncode == 0, checked.stderr
    assert checked.stdout.splitlines()[-1].startswith(f"verify {run_dir}/merged: 1 file, 64,522 tokens: OK")
    record = json.loads((run_dir / "_BUILD.json").read_text())
    (run_dir / "_BUILD.json").write_text(json.dumps(record | {"tokens": 64_523}))  # a record its dataset belies
    checked = cli("verify", str(run_dir))
    assert checked.returncode == 1 and checked.stdout.splitlines()[-3].startswith(
        f"{run_dir}/_BUILD.json: records 64,523 tokens and digest {record['digest']}, but its dataset holds 64,522"
    )
    assert checked.stdout.splitlines()[-2] == (
        f"{run_dir}/merged: ids checked against the build's tokenizer: vocabulary 4,096, EOS id 0"
    )

    done = cli("build", str(sample_corpus), *options, "--build-id", "manual__2026-12-01T17:39:28+00:00")
    assert done.returncode == 0, done.stderr
    lines = dict(line.split(": ", 1) for line in done.stdout.splitlines() if ": " in line)
    report = tmp_path / "manual__2026-12-01T17-39-28-00-00~f70f137e" / "report.html"  # a safe spelling: no "%"
    assert lines["report"] == str(report) and report.exists()
    url = lines["open"].strip()
    assert url == f"file://{report}"  # encoded once: issue 54 found "%253A"
    assert Path(url2pathname(urlparse(url).path)) == report  # what a browser opens


def test_inspect_reads_megatron_output_and_count_speaks_plainly(tmp_path, sample_corpus, sample_tokenizer) -> None:
    out = tmp_path / "megatron"
    made = cli(
        "tokenize",
        str(sample_corpus),
        "--output",
        str(out),
        "--tokenizer",
        str(sample_tokenizer),
        "--format",
        "megatron",
        "--no-shuffle",
    )
    assert made.returncode == 0, made.stderr
    shown = cli("inspect", str(out), "--decode", "1", "--tokenizer", str(sample_tokenizer))
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert lines[0] == f"{out}/00000_00000_unshuffled.bin: 64,522 tokens, 308 sequences, Megatron uint16"
    assert lines[1] == "total: 1 file, 308 index entries, 64,522 tokens"
    assert lines[2].startswith(f"--- {out}/00000_00000_unshuffled.bin document 0 (")
    counted = cli("count", str(sample_corpus), "--tokenizer", str(sample_tokenizer))
    assert counted.returncode == 0, counted.stderr
    assert counted.stdout.strip() == (
        "count: 308 docs, 64,522 tokens (209.5 tokens a document on average, the longest 1,474), 1 empty, "
        "0 rejected, in 4 files"
    )


def test_errors_are_one_line_with_exit_1(tmp_path, sample_corpus, sample_tokenizer) -> None:
    done = cli(
        "tokenize",
        str(sample_corpus),
        "--output",
        str(tmp_path),
        "--tokenizer",
        str(sample_tokenizer),
        "--eos-token",
        "</s>",
    )
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [
        f"error: EOS token '</s>' is not in the vocabulary of {sample_tokenizer}; its own end-of-text token is "
        f"'{EOS}' (from its vocabulary): leave the EOS unset to use it"
    ]
    truncated = tmp_path / "cut.jsonl.gz"
    truncated.write_bytes((sample_corpus / "part-00000.jsonl.gz").read_bytes()[:5000])
    done = cli("tokenize", str(truncated), "--output", str(tmp_path / "o"), "--tokenizer", str(sample_tokenizer))
    assert done.returncode == 1
    assert (
        done.stderr.strip()
        .splitlines()[-1]
        .startswith(f"error: {truncated}: corrupt or truncated gzip data after line ")
    )
    bad = write_jsonl(tmp_path / "bad.jsonl", ["{nope"] * 3)
    done = cli(
        "tokenize",
        str(bad),
        "--output",
        str(tmp_path / "b"),
        "--tokenizer",
        str(sample_tokenizer),
        "--max-rejects",
        "1",
    )
    assert done.returncode == 1 and "exceed max_rejects=1" in done.stderr


def test_a_hub_name_without_the_hub_fails_at_once_in_one_line(tmp_path, sample_corpus) -> None:
    """Its client retried for ~25 s before failing, in a page of warnings."""
    environment = os.environ | {"HF_ENDPOINT": "https://hub.invalid", "HF_HOME": str(tmp_path / "hf")}
    started = time.monotonic()
    command = [sys.executable, "-m", "tokenization.cli", "count", str(sample_corpus), "--tokenizer", "org/model"]
    done = subprocess.run(command, capture_output=True, text=True, env=environment)
    assert done.returncode == 1 and time.monotonic() - started < 15
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("error: org/model: no such local tokenizer file, and the HuggingFace hub (hub.invalid) ")
    assert "cannot be reached to fetch it" in line and line.endswith("or an fsspec URL")


def test_a_project_error_is_one_line_and_any_other_error_shows_its_traceback(tmp_path, sample_corpus) -> None:
    failing = (
        "import sys, tokenization.cli as cli, tokenization.stages.count as counting\n"
        "from tokenization.inputs.formats import InputError\n"
        "def count(config): raise {}\n"
        "counting.count_tokens = count\n"
        "sys.exit(cli.main(['count', sys.argv[1], '--tokenizer', 'unused.json']))"
    )
    for error, last in [
        ("InputError('a.jsonl line 3: not JSON')", "error: a.jsonl line 3: not JSON"),
        ("ZeroDivisionError('a bug')", "ZeroDivisionError: a bug"),
    ]:
        done = subprocess.run(
            [sys.executable, "-c", failing.format(error), str(sample_corpus)], capture_output=True, text=True
        )
        lines = done.stderr.strip().splitlines()
        assert (done.returncode, lines[-1]) == (1, last), done.stderr
        assert ("Traceback" in done.stderr) == (error.startswith("ZeroDivisionError")), done.stderr
    not_a_run = cli("report", str(tmp_path))
    assert (not_a_run.returncode, not_a_run.stderr.strip().splitlines()) == (
        1,
        [f"error: {tmp_path}: no _BUILD.json; the build is not complete or this is not a run"],
    )


def test_usage_errors_exit_2(tmp_path, sample_corpus, sample_tokenizer) -> None:
    assert cli("tokenize", "x", "--tokenizer", str(sample_tokenizer)).returncode == 2  # no --output
    assert cli("tokenize", "x", "--output", "o", "--tokenizer", "t", "--max-tokens-per-file", "0").returncode == 2
    assert cli("frobnicate").returncode == 2
    tokenize = ("tokenize", str(sample_corpus), "--output", str(tmp_path), "--tokenizer", str(sample_tokenizer))
    for wrong, message in [
        (("--rank", "3", "--world-size", "2"), "rank 3 is outside 0..1"),
        (("--max-rejects", "-1"), "--max-rejects must be at least 0, got -1"),  # flags, not the params' names
        (("--max-reject-fraction", "1.5"), "--max-reject-fraction must be at most 1, got 1.5"),
        (("--text-key", ""), "--text-key must not be empty"),
        (("--eos-token", EOS, "--no-eos"), "--no-eos conflicts with --eos-token"),
        (("--engine", "fast"), "argument --engine: invalid choice: 'fast'"),
        (("--sav-loss", "--seed=3", "extra"), "unrecognized arguments: --sav-loss (did you mean --save-loss?) extra"),
    ]:
        done = cli(*tokenize, *wrong)
        assert done.returncode == 2 and message in done.stderr, (wrong, done.stderr)
        assert done.stderr.startswith("usage: tokenization tokenize"), done.stderr
    # A misspelled required flag: argparse stops at the flag missing; the refusal names the one meant as well.
    done = cli("tokenize", str(sample_corpus), "--output", str(tmp_path), "--tokeniser", str(sample_tokenizer))
    assert done.returncode == 2 and done.stderr.splitlines()[-1] == (
        "tokenization tokenize: error: the following arguments are required: --tokenizer; "
        "unrecognized arguments: --tokeniser (did you mean --tokenizer?)"
    )
    assert list(tmp_path.iterdir()) == []  # refused before anything was written


@pytest.mark.parametrize(
    ("wrong", "refusal"),
    [
        (
            ("--build-id", "LATEST"),
            "build id 'LATEST' is the name (ignoring case, as some filesystems do) of out/LATEST, which points at the "
            "newest complete build: choose another build id (in Airflow, another run id)",
        ),
        (
            ("--build-id", "x" * 300),
            f"build id '{'x' * 40}'... names a folder of 300 characters, more than the 200 a run "
            "folder's name may have: choose a shorter build id",
        ),
        (
            ("--build-id", "night\udcff"),  # argv bytes that are not UTF-8
            "build id 'night\\udcff' holds a control character or bytes that are not UTF-8: choose a build id of "
            "printable characters",
        ),
        (("--seed", "1" * 71), f"seed must be at most 9223372036854775807, got {'1' * 71}"),
        (("--max-reject-fraction", "nan"), "--max-reject-fraction must be a finite number, got nan"),
        (
            ("--output", "s3:/b/x"),
            "output 's3:/b/x' is no URL, a scheme being followed by '://' (fsspec would take it for a local path): "
            "write s3://b/x, or ./s3:/b/x for a local path",
        ),
    ],
)
def test_a_build_refuses_values_that_crashed_it_before_any_work(
    tmp_path, sample_corpus, sample_tokenizer, wrong: tuple[str, ...], refusal: str
) -> None:
    """Issue 37: each of these ran some or all of a build, then crashed with a traceback (or, for s3:/b/x, wrote
    to a local folder named s3:)."""
    command = [sys.executable, "-m", "tokenization.cli", "build", str(sample_corpus), "--output", "out"]
    command += ["--tokenizer", str(sample_tokenizer), "--context-window", "0", *wrong]
    done = subprocess.run(command, capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines()[-1] == f"tokenization build: error: {refusal}"
    assert list(tmp_path.iterdir()) == []  # nothing written: not the output, nor a folder named s3:


def test_every_command_refuses_a_url_missing_a_slash() -> None:
    """Issue 37: s3:/b/x is a local path to fsspec; the commands that take a location beside options refuse it too."""
    done = cli("verify", "s3:/b/x")
    assert done.returncode == 2 and done.stderr.splitlines()[-1] == (
        "tokenization verify: error: argument path: 's3:/b/x' is no URL, a scheme being followed by '://' (fsspec "
        "would take it for a local path): write s3://b/x, or ./s3:/b/x for a local path"
    )


def test_a_text_key_no_record_has_fails_naming_it_and_leaves_no_marker(tmp_path, sample_tokenizer) -> None:
    pairs = write_jsonl(tmp_path / "pairs.jsonl", [{"prompt": f"q{i}", "response": f"a{i}"} for i in range(233)])
    done = cli("tokenize", str(pairs), "--output", str(tmp_path / "out"), "--tokenizer", str(sample_tokenizer))
    assert done.returncode == 1
    assert done.stderr.strip().splitlines()[-1] == (
        f"error: rank 0: read 233 records but wrote none: 233 rejected (missing_text 233; first: {pairs} line 1); "
        "text key 'text'; its records have the fields prompt, response"
    )
    assert not (tmp_path / "out" / "_completions").exists()
    assert len((tmp_path / "out" / "_quarantine" / "00000.jsonl").read_text().splitlines()) == 233
    counted = cli("count", str(pairs), "--tokenizer", str(sample_tokenizer), "--text-key", "body")
    assert counted.returncode == 1 and "text key 'body'" in counted.stderr


def test_a_mostly_rejected_rank_fails_on_the_fraction(tmp_path, sample_tokenizer) -> None:
    records = [{"text": f"record {i}"} for i in range(50)] + ["{broken"] * 2
    inputs = write_jsonl(tmp_path / "in.jsonl", records)
    args = ("tokenize", str(inputs), "--tokenizer", str(sample_tokenizer))
    done = cli(*args, "--output", str(tmp_path / "strict"))
    assert done.returncode == 1 and "2 of 52 records rejected (3.85%), above max_reject_fraction=0.01" in done.stderr
    assert cli(*args, "--output", str(tmp_path / "lenient"), "--max-reject-fraction", "0.05").returncode == 0


def test_storage_and_network_failures_are_one_line(tmp_path, sample_corpus, sample_tokenizer) -> None:
    no_credentials = {
        "AWS_EC2_METADATA_DISABLED": "true",
        "AWS_CONFIG_FILE": "/nonexistent",
        "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent",
    }
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")} | no_credentials
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "tokenization.cli",
            "tokenize",
            str(sample_corpus),
            "--output",
            "s3://corpus/out",
            "--tokenizer",
            str(sample_tokenizer),
        ],
        capture_output=True,
        text=True,
        env=env,
    )
    assert done.returncode == 1
    assert done.stderr.strip().splitlines()[-1] == (
        "error: s3://corpus/out: NoCredentialsError: Unable to locate credentials (set credentials in the "
        "environment, an AWS profile or the Airflow connection)"
    )
    unreachable = cli(
        "tokenize", "http://127.0.0.1:9/corpus.jsonl", "--output", str(tmp_path), "--tokenizer", str(sample_tokenizer)
    )
    last = unreachable.stderr.strip().splitlines()[-1]
    assert unreachable.returncode == 1 and last.startswith("error: http://127.0.0.1:9/corpus.jsonl: "), last
    assert "Traceback" not in unreachable.stderr


def test_engine_and_threads_reach_the_stats(tmp_path, sample_corpus, sample_tokenizer) -> None:
    engines = {}
    for engine in ("auto", "hf"):
        stats = tmp_path / f"{engine}.json"
        done = cli(
            "count",
            str(sample_corpus),
            "--tokenizer",
            str(sample_tokenizer),
            "--eos-token",
            EOS,
            "--engine",
            engine,
            "--threads",
            "1",
            "--stats-out",
            str(stats),
        )
        assert done.returncode == 0, done.stderr
        engines[engine] = json.loads(stats.read_text())
    assert [engines[e]["tokenizer"]["engine"] for e in ("auto", "hf")] == ["gigatoken", "hf"]
    assert engines["auto"]["tokens"] == engines["hf"]["tokens"] == 64522
    assert engines["auto"]["tokenizer"]["self_checked_docs"] == 1  # document 0 of 308: one in CHECK_EVERY
    assert cli("count", str(sample_corpus), "--tokenizer", str(sample_tokenizer), "--threads", "0").returncode == 2


LOG_LINE = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} [A-Z]+ ")


def interrupted(command: list[str], started, cwd: Path) -> subprocess.CompletedProcess:
    """``command`` run in a process group of its own, sent Ctrl-C as a terminal sends it (to the whole group) once
    ``started()`` (asked once the interpreter handles Ctrl-C); returns once the group is empty: no worker outlives
    it."""
    running = subprocess.Popen(
        [sys.executable, "-m", "tokenization.cli", *command],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=cwd,
        start_new_session=True,
        # Ctrl-C's disposition as a terminal's job has it: a background job of a non-interactive shell (`make test &`)
        # starts with SIGINT ignored, and passes that on, and Python then raises no KeyboardInterrupt at all
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    deadline = time.monotonic() + 120
    try:
        while not (_handles_ctrl_c(running.pid) and started()):
            assert running.poll() is None and time.monotonic() < deadline, "it finished, or never started"
            time.sleep(0.01)
        os.killpg(running.pid, signal.SIGINT)
        stdout, stderr = running.communicate(timeout=60)
    finally:
        if running.poll() is None:  # a test that fails leaves no process behind
            os.killpg(running.pid, signal.SIGKILL)
            running.communicate()
    deadline = time.monotonic() + 10
    while _group_alive(running.pid):
        assert time.monotonic() < deadline, "a worker outlived its command"
        time.sleep(0.05)
    return subprocess.CompletedProcess(running.args, running.returncode, stdout, stderr)


def _handles_ctrl_c(pid: int) -> bool:
    """Whether the process has set its own SIGINT handler (Python does as it starts): a Ctrl-C before that is the
    kernel's default, which ends a loaded machine's slow-starting interpreter silently (-2, nothing printed)."""
    status = Path(f"/proc/{pid}/status").read_text()
    caught = int(next(line for line in status.splitlines() if line.startswith("SigCgt:")).split()[1], 16)
    return bool(caught & 1 << (signal.SIGINT - 1))


def _group_alive(group: int) -> bool:
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    return True


def test_ctrl_c_stops_a_build_and_its_workers_in_one_line(tmp_path, sample_corpus, sample_tokenizer) -> None:
    """Issue 37: Ctrl-C printed a 20-line traceback ending in KeyboardInterrupt, and one more a worker process."""
    command = ["build", str(sample_corpus), "--output", "out", "--tokenizer", str(sample_tokenizer), "--seed", "1"]
    command += ["--num-ranks", "64", "--parallel", "2", "--context-window", "0", "--build-id", "night 1"]
    ranks = Path(folder_for(str(tmp_path / "out"), "night 1")) / "ranks" / "_completions"
    done = interrupted(command, lambda: any(ranks.glob("*.json")), tmp_path)
    assert done.returncode == 130 and "Traceback" not in done.stderr, done.stderr
    assert [line for line in done.stderr.splitlines() if not LOG_LINE.match(line)] == [
        "interrupted: tokenization build stopped; an unfinished attempt's files stay for the next run to resume or "
        "clear; resume it with --build-id 'night 1'"
    ]
    assert len(list(ranks.glob("*.json"))) < 64
    resumed = subprocess.run(
        [sys.executable, "-m", "tokenization.cli", *command], capture_output=True, text=True, cwd=tmp_path
    )
    assert resumed.returncode == 0, resumed.stderr
    assert "verify: passed" in resumed.stdout and not list((tmp_path / "out").rglob(".staging"))


@pytest.mark.parametrize(
    ("after", "delay"),
    [*(("start", d) for d in (0.1, 0.2, 0.35, 0.5, 0.7, 0.9)), *(("plan", d) for d in (0, 0.05, 0.1))],
)
def test_ctrl_c_at_any_moment_of_a_build_is_one_line(tmp_path, sample_tokenizer, after, delay) -> None:
    """Issue 51: Ctrl-C ~0.15 s after the start printed the imports' KeyboardInterrupt traceback; at 0.5-0.7 s, as
    the workers started (just after the plan), a worker forked but not yet the pool's outlived its parent, and
    printed a FileNotFoundError traceback (its semaphores gone with the parent). The corpus, 4 files of ~14 MB,
    keeps the build going past the last moment (the sample corpus's whole build now ends within 0.9 s)."""
    for k in range(4):
        write_jsonl(tmp_path / "corpus" / f"part-{k}.jsonl", sample_records() * 50)
    command = ["build", "corpus", "--output", "out", "--tokenizer", str(sample_tokenizer), "--seed", "1"]
    command += ["--num-ranks", "4", "--parallel", "2", "--context-window", "1025", "--build-id", "b"]
    begun: list[float] = []

    def started() -> bool:  # "start": from when the interpreter handles Ctrl-C (``interrupted`` waits for it)
        if not begun and (after == "start" or (tmp_path / "out" / "b" / "_RUN.json").exists()):
            begun.append(time.monotonic())
        return bool(begun) and time.monotonic() >= begun[0] + delay

    done = interrupted(command, started, tmp_path)
    assert done.returncode == 130 and "Traceback" not in done.stderr, done.stderr
    said = [line for line in done.stderr.splitlines() if not LOG_LINE.match(line)]
    assert len(said) == 1 and said[0] in {
        "interrupted: tokenization stopped before its command began",
        "interrupted: tokenization build stopped; an unfinished attempt's files stay for the next run to resume or "
        "clear; resume it with --build-id b",
    }, done.stderr


def test_ctrl_c_inside_code_made_from_a_string_exits_130(tmp_path) -> None:
    """A Ctrl-C landing while a lazy import makes a dataclass (``exec`` of its methods' source) left CPython's mark of
    an unhandled interrupt set: the command said its one line, then killed itself with SIGINT (-2, not 130)."""
    (tmp_path / "interrupted_in_exec.py").write_text(
        "import dataclasses, sys\n"
        "from tokenization.cli import main\n"
        "from tokenization.cli.commands import COMMANDS\n"
        'stopped = dataclasses.replace(COMMANDS["verify"], run=lambda args: exec("raise KeyboardInterrupt"))\n'
        'COMMANDS["verify"] = stopped\n'
        "sys.exit(main())\n"
    )
    done = subprocess.run(
        [sys.executable, "-m", "interrupted_in_exec", "verify", "out"], capture_output=True, text=True, cwd=tmp_path
    )
    said = "interrupted: tokenization verify stopped; an unfinished attempt's files stay for the next run to resume or "
    said += "clear"
    assert (done.returncode, done.stderr.splitlines()) == (130, [said]), done.stderr


@pytest.mark.parametrize("delay", [0.0, 0.3])
def test_ctrl_c_stops_any_command_in_one_line(tmp_path, sample_tokenizer, delay: float) -> None:
    """Interrupted as its attempt begins, and as the tokenizer loads: gigatoken, in the main thread, turned a
    KeyboardInterrupt into a panic, or lost it (the rank then failed on lists of ids, or finished)."""
    # ~55 MB: ~1 s of encoding at gigatoken's rate on this machine, so the interrupt comes before the end
    corpus = write_jsonl(tmp_path / "corpus.jsonl", sample_records() * 200)
    command = ["tokenize", str(corpus), "--output", "out", "--tokenizer", str(sample_tokenizer)]
    begun: list[float] = []

    def started() -> bool:
        if not begun and (tmp_path / "out" / ".staging").exists():
            begun.append(time.monotonic())
        return bool(begun) and time.monotonic() >= begun[0] + delay

    done = interrupted(command, started, tmp_path)
    assert done.returncode == 130 and "Traceback" not in done.stderr, done.stderr
    assert [line for line in done.stderr.splitlines() if not LOG_LINE.match(line)] == [
        "interrupted: tokenization tokenize stopped; an unfinished attempt's files stay for the next run to resume "
        "or clear"
    ]


HEAVY = ("tokenizers", "gigatoken", "awkward", "jinja2", "airflow", "transformers", "tiktoken")
IMPORTED = (
    "import sys; from tokenization.cli import main; code = main(sys.argv[1:]); "
    f"print(sorted(m for m in sys.modules if m.split('.')[0] in {HEAVY!r})); sys.exit(code)"
)


@pytest.mark.parametrize(("given", "expected"), [(None, "1"), ("4", "4")])
def test_the_program_holds_openblas_to_one_thread_unless_told(given: str | None, expected: str) -> None:
    """numpy's import starts OpenBLAS's threads, which spin in every process and worker and serve nothing here."""
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"} | (
        {"OPENBLAS_NUM_THREADS": given} if given else {}
    )
    code = "import os, sys; sys.argv[0] = 'tokenization'; import tokenization.cli; print(os.environ[%r])"
    code %= "OPENBLAS_NUM_THREADS"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert done.stdout.strip() == expected


def test_a_tokenize_without_a_template_imports_no_template_engine(tmp_path, sample_corpus, sample_tokenizer) -> None:
    """Jinja2 (~0.3 s to import) is for chat templates: a tokenize of plain text never imports it."""
    command = ["tokenize", str(sample_corpus), "--output", str(tmp_path / "out"), "--tokenizer", str(sample_tokenizer)]
    done = subprocess.run([sys.executable, "-c", IMPORTED, *command], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "jinja2" not in done.stdout.strip().splitlines()[-1]


def test_a_tokenize_names_the_installed_versions_without_reading_package_metadata(
    tmp_path, sample_corpus, sample_tokenizer
) -> None:
    """Its manifest names the versions that decide the bytes; reading package metadata for them imports its parser
    (~17 ms, email's) and looks each package up (~2.5 ms): 3% of a GPT-2 rank of 42 MB. The packages say them."""
    import importlib.metadata

    code = (
        "import sys; from tokenization.cli import main; code = main(sys.argv[1:]); "
        "print('importlib.metadata' in sys.modules); sys.exit(code)"
    )
    command = ["tokenize", str(sample_corpus), "--output", str(tmp_path / "out"), "--tokenizer", str(sample_tokenizer)]
    done = subprocess.run([sys.executable, "-c", code, *command], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "False"
    versions = json.loads(next((tmp_path / "out" / "_manifests").glob("*.json")).read_text())["versions"]
    installed = {name: importlib.metadata.version(name) for name in ("corpus-tokenization", "tokenizers")}
    assert {name: versions[name] for name in installed} == installed


@pytest.mark.parametrize("command", ["merge", "context-shuffle"])
def test_a_byte_moving_command_imports_no_tokenizer_templates_or_airflow(tmp_path, command) -> None:
    """A merge or a context shuffle moves bytes: its process loads no tokenizer library, template engine or
    Airflow, whose imports took longer than its work on a small shard."""
    import numpy as np

    from tokenization.formats.ds import TokenFileWriter

    (tmp_path / "in").mkdir()
    path = tmp_path / "in" / "00000_00000_doc_shuffled.ds"
    writer = TokenFileWriter(path, tokenizer="t", token_size=2, save_loss=False)
    writer.write(np.arange(1, 3001, dtype=np.uint16), np.arange(300, 3001, 300))
    writer.close()
    named = ["--save-filename", "m"] if command == "merge" else []
    done = subprocess.run(
        [sys.executable, "-c", IMPORTED, command, str(tmp_path / "in"), "--output", str(tmp_path / "out"), *named],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "[]"


# What a command's start must not import, beside HEAVY: Arrow (~0.1 s, and a merge's units are copied by the C
# helper) and tqdm (bars are drawn on a terminal only). An encoding command's start may load HF's tokenizers (its
# types are in its options' modules), not gigatoken or awkward (~0.3 s together), which encoding loads.
STARTS = {
    **dict.fromkeys(["merge", "context-shuffle", "verify", "mds", "cache", "inspect", "report"], HEAVY),
    **dict.fromkeys(["tokenize", "count", "build"], tuple(m for m in HEAVY if m != "tokenizers")),
}
START_IMPORTED = (
    "import json, sys; from tokenization.cli import main\ntry: main(sys.argv[1:])\nexcept SystemExit: pass\n"
    "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules})))"
)


@pytest.mark.parametrize("command", sorted(STARTS))
def test_a_commands_start_imports_only_what_it_needs(command: str) -> None:
    """A command's start (its options parsed, here by --help) imports no engine, template engine, Arrow or tqdm:
    a byte-moving command starts in well under 0.3 s with its bytecode compiled (0.56 s with them)."""
    done = subprocess.run([sys.executable, "-c", START_IMPORTED, command, "--help"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    imported = set(json.loads(done.stdout.strip().splitlines()[-1]))
    assert imported & {*STARTS[command], "pyarrow", "tqdm"} == set()


def test_a_merge_with_the_c_helper_imports_no_arrow(tmp_path) -> None:
    """The C helper copies a block's units into place: a merge of local files never imports Arrow (its numpy
    path puts them in order with Arrow's take)."""
    if native.helper() is None:
        pytest.skip("the C helper cannot be built here")
    import numpy as np

    from tokenization.formats.ds import TokenFileWriter

    (tmp_path / "in").mkdir()
    path = tmp_path / "in" / "00000_00000_doc_shuffled.ds"
    writer = TokenFileWriter(path, tokenizer="t", token_size=2, save_loss=True)
    writer.write(np.arange(1, 3001, dtype=np.uint16), np.arange(300, 3001, 300), np.ones(3000, np.uint8))
    writer.close()
    command = ["merge", str(tmp_path / "in"), "--output", str(tmp_path / "out"), "--save-filename", "m", "--save-loss"]
    probe = IMPORTED.replace(repr(HEAVY), repr(("pyarrow", "tqdm")))
    done = subprocess.run([sys.executable, "-c", probe, *command], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "[]"
