"""Mixtures (``tokenization.mixing``): one build of several sources at chosen token shares. The shares are measured
from the decoded output, never from the build's records: each source's documents are written with letters of their
own, so the text of any document or piece of one tells its source."""

from __future__ import annotations

import json
import os
import random
import re
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import fsspec
import numpy as np
import pytest
from tokenizers import Tokenizer

from tests.support.builds import in_process
from tests.support.corpus import write_jsonl
from tests.support.tokenizers import EOS
from tokenization import mixing, orderings
from tokenization.builds.config import BuildConfig
from tokenization.builds.plan import list_inputs
from tokenization.builds.run import Build
from tokenization.errors import UsageError
from tokenization.formats.ds import TokenFile, TokenFileError
from tokenization.inputs.formats import InputError
from tokenization.mixing import spec as mixture_spec
from tokenization.output.manifest import manifest_name
from tokenization.records import MergeManifest, Mixture, MixtureSource

LETTERS = {"web": "abcdefg", "code": "hijklmn", "math": "opqrstu"}
DOCS = {"web": 2000, "code": 300, "math": 1000}  # ~120 tokens a document; code must be repeated to reach its share
WEIGHTS = {"web": 0.6, "code": 0.3, "math": 0.1}
DEEP = "nested deeper than a mixture: a mapping of 'tokens' and 'sources', a list of mappings of numbers and strings"


def write_sources(root: Path, docs: dict[str, int] = DOCS, seed: int = 0) -> dict[str, str]:
    """Each source's input folder: two files of documents of 5 to 60 words made of its own letters."""
    rng = random.Random(seed)
    for name, letters in LETTERS.items():
        for part in range(2):
            texts = [
                " ".join(
                    "".join(rng.choice(letters) for _ in range(rng.randint(2, 7))) for _ in range(rng.randint(5, 60))
                )
                for _ in range(docs[name] // 2)
            ]
            write_jsonl(root / name / f"part-{part}.jsonl", [{"text": text} for text in texts])
            hour_ago = time.time_ns() - 3600 * 10**9  # not written as its rank hashed it (git's racy case): a
            os.utime(root / name / f"part-{part}.jsonl", ns=(hour_ago, hour_ago))  # re-mix's plan knows its sha256
    return {name: str(root / name) for name in LETTERS}


def spec(inputs: dict[str, str], tokens: int | None, **overrides) -> dict:
    sources = [{"name": name, "input": inputs[name], "weight": WEIGHTS[name]} for name in LETTERS]
    sources[1]["max_repetition"] = 3
    return {"tokens": tokens, "sources": sources} | overrides


def config(tmp_path: Path, sample_tokenizer: Path, mixture: dict, **options) -> BuildConfig:
    settings = {"seed": 5, "num_ranks": 2, "context_window": 300, "num_context_shards": 2, "save_loss": True}
    return BuildConfig(
        output=str(tmp_path / "out"),
        tokenizer=str(sample_tokenizer),
        mixture=mixture,
        eos_token=EOS,
        **settings | options,
    )


def source_of(text: str) -> str | None:
    """The source whose letters a text is made of (None for a piece of no letter: an EOS alone)."""
    found = {c for c in text if c.isalpha()}
    owners = [name for name, letters in LETTERS.items() if found and found <= set(letters)]
    assert len(owners) <= 1 and (owners or not found), text
    return owners[0] if owners else None


def decoded(paths: list[Path], tokenizer: Tokenizer) -> list[tuple[str | None, str | None, str, int]]:
    """Every index entry of these ``.ds`` files, in order: (its source by its text, by its sidecar, its text, its
    tokens)."""
    entries: list[tuple[str | None, str | None, str, int]] = []
    eos = tokenizer.token_to_id(EOS)
    for path in paths:
        file = TokenFile(str(path))
        assert file.metadata is not None and file.sources is not None
        names = file.metadata.sources
        tokens, ends = np.asarray(file.tokens), np.asarray(file.ends, dtype=np.int64)
        for number, (start, end) in enumerate(zip(np.concatenate([[0], ends[:-1]]), ends, strict=True)):
            ids = [int(t) for t in tokens[start:end] if t != eos]
            text = tokenizer.decode(ids)
            entries.append((source_of(text), names[int(file.sources[number])], text, int(end - start)))
    return entries


def shares(entries) -> dict[str, float]:
    tokens: Counter = Counter()
    for by_text, _, _, length in entries:
        tokens[by_text] += length
    return {name: tokens[name] / sum(tokens.values()) for name in LETTERS}


def test_a_three_source_mixture_reaches_its_shares_in_every_tenth(tmp_path, sample_tokenizer) -> None:
    """The shares within one mean document of their targets; every tenth of the merged output within 2 points; the
    sidecars of the merged and the context-shuffled files name each document's (piece's) source; the small source
    is used 2.x times: every document twice, some three times."""
    inputs = write_sources(tmp_path / "data")
    built = config(tmp_path, sample_tokenizer, spec(inputs, 300_000), keep_intermediate=True)
    published = in_process(Build.start(built, "mix"))
    tokenizer = Tokenizer.from_file(str(sample_tokenizer))
    run = Path(published.record.dataset).parent
    merged = decoded(sorted((run / "merged").glob("*.ds")), tokenizer)
    assert all(by_text == by_sidecar for by_text, by_sidecar, _, _ in merged)
    mean = np.mean([length for _, _, _, length in merged])
    total = sum(length for _, _, _, length in merged)
    for name, share in shares(merged).items():
        assert abs(share - WEIGHTS[name]) * total <= mean, (name, share)
    lengths = np.array([length for _, _, _, length in merged])
    ends = np.cumsum(lengths)
    for start in np.linspace(0, 0.9, 37) * total:  # every tenth, starting anywhere
        inside = (ends > start) & (ends - lengths < start + 0.1 * total)
        tenth = shares([entry for entry, held in zip(merged, inside, strict=True) if held])
        assert all(abs(tenth[name] - WEIGHTS[name]) <= 0.02 for name in LETTERS), (start, tenth)
    code = Counter(text for by_text, _, text, _ in merged if by_text == "code")
    assert len(code) == DOCS["code"] and set(code.values()) <= {2, 3} and 3 in code.values()
    pieces = decoded(sorted((run / "context").glob("*.ds")), tokenizer)
    assert all(by_text in (None, by_sidecar) for by_text, by_sidecar, _, _ in pieces)
    assert sum(length for _, _, _, length in pieces) == total == published.record.tokens
    record = json.loads((run / "_BUILD.json").read_text())
    books = {source["name"]: source for source in record["mixture"]}
    assert books["code"]["docs_chosen"] == DOCS["code"] and books["code"]["docs_repeated"] == DOCS["code"]
    for name, book in books.items():
        assert book["docs_read"] == book["docs_chosen"] + book["docs_not_chosen"] + book["empty"] + book["quarantined"]
        assert book["docs_read"] == DOCS[name] and book["target"] == WEIGHTS[name]


def test_every_bucket_carries_the_mixture(tmp_path, sample_tokenizer) -> None:
    inputs = write_sources(tmp_path / "data", {"web": 600, "code": 120, "math": 600})
    built = config(
        tmp_path, sample_tokenizer, spec(inputs, 48_000), merge_mode="bucketed", num_buckets=3, context_window=0
    )
    published = in_process(Build.start(built, "buckets"))
    tokenizer = Tokenizer.from_file(str(sample_tokenizer))
    merged = Path(published.record.dataset)
    for bucket in range(3):
        entries = decoded(sorted(merged.glob(f"{bucket:05d}_*.ds")), tokenizer)
        mean = np.mean([length for _, _, _, length in entries])
        total = sum(length for _, _, _, length in entries)
        for name, share in shares(entries).items():
            assert abs(share - WEIGHTS[name]) * total <= 2 * mean, (bucket, name, share)
    entries = decoded(sorted(merged.glob("*.ds")), tokenizer)
    assert all(by_text == by_sidecar for by_text, by_sidecar, _, _ in entries)
    assert abs(sum(length for *_, length in entries) - 48_000) <= 3 * np.mean([e[3] for e in entries])


def test_a_source_too_small_for_its_share_is_refused_by_name(tmp_path, sample_tokenizer) -> None:
    """Code, used at most 3 times, cannot be 30% of a budget past 3x its tokens: refused before the merge writes a
    byte, naming the source, its tokens and the tokens it needs."""
    inputs = write_sources(tmp_path / "data")
    mixture = spec(inputs, 200_000)
    mixture["sources"][0]["weight"], mixture["sources"][1]["weight"] = 0.3, 0.6  # code: 120,000 of 3 x ~36,000
    build = Build.start(config(tmp_path, sample_tokenizer, mixture), "small")
    for rank in build.ranks:
        build.tokenize(rank, progress=False)
    has = 0
    for r in build.ranks:
        sources = build.tokenize(r, progress=False).record.sources
        assert sources is not None
        has += sources[1].tokens
    refusal = (
        f"mixture source 'code' has {has:,} tokens, used at most 3 times: {3 * has:,}; its 0.6 of the weights needs "
        "120,000 of the 200,000: lower its weight or the budget, or raise its max_repetition"
    )
    with pytest.raises(mixing.MixtureShortfall) as refused:  # a data error, not a usage one: no usage block
        build.merge(progress=False)
    assert str(refused.value) == refusal and not isinstance(refused.value, UsageError)
    assert not list((Path(build.layout.merged.path)).glob("*.ds"))


def test_a_source_the_ranks_kept_nothing_of_is_refused_by_name_before_the_merge(tmp_path, sample_tokenizer) -> None:
    """A source whose files hold only empty documents: the merge refuses it by name, before a byte is written (it
    wrote an empty merge, which verify then found wanting without naming the source)."""
    inputs = write_sources(tmp_path / "data", {"web": 40, "code": 20, "math": 20})
    write_jsonl(tmp_path / "empty" / "part-0.jsonl", [{"text": ""}] * 5)
    build = Build.start(config(tmp_path, sample_tokenizer, spec(inputs | {"math": str(tmp_path / "empty")}, None)), "e")
    for rank in build.ranks:
        build.tokenize(rank, progress=False)
    with pytest.raises(mixing.MixtureShortfall) as refused:
        build.merge(progress=False)
    assert str(refused.value) == (
        "mixture source 'math' has no tokens: the ranks kept none of its documents (its files are empty, or every "
        "document in them was empty or rejected)"
    )
    assert not list((Path(build.layout.merged.path)).glob("*.ds"))


def test_a_target_no_document_fits_is_refused_by_name_before_the_merge(tmp_path, sample_tokenizer) -> None:
    """A budget of 3 tokens at equal weights: each source's target (one token) is less than half its shortest
    document, so none would be chosen and the merge would be empty."""
    inputs = write_sources(tmp_path / "data", {"web": 40, "code": 20, "math": 20})
    mixture = spec(inputs, 3)
    for source in mixture["sources"]:
        source["weight"] = 1
    build = Build.start(config(tmp_path, sample_tokenizer, mixture), "tiny")
    for rank in build.ranks:
        build.tokenize(rank, progress=False)
    with pytest.raises(mixing.MixtureShortfall) as refused:
        build.merge(progress=False)
    shortest = r"\(its shortest document has \d+\): raise tokens or its weight"
    assert re.fullmatch(rf"mixture source 'web': no document fits its target of 1 token {shortest}", str(refused.value))


def test_a_late_refusal_is_one_line_without_the_usage(tmp_path, sample_tokenizer) -> None:
    """``tokenization build`` of a source too small for its share: one line and status 1, not the command's
    25-line usage (a data error found after tokenizing is no usage error)."""
    inputs = write_sources(tmp_path / "data", {"web": 40, "code": 20, "math": 20})
    mixture = spec(inputs, 100_000)
    (tmp_path / "mix.json").write_text(json.dumps(mixture))
    command = ["build", "--mixture", str(tmp_path / "mix.json"), "--output", str(tmp_path / "out"), "--tokenizer"]
    command += [str(sample_tokenizer), "--eos-token", EOS, "--num-ranks", "1", "--build-id", "late"]
    done = subprocess.run([sys.executable, "-m", "tokenization.cli", *command], capture_output=True, text=True)
    last = done.stderr.strip().splitlines()[-1]
    assert (done.returncode, "usage:" in done.stderr) == (1, False), done.stderr
    assert last.startswith("error: mixture source 'web' has ") and last.endswith("or raise its max_repetition")


@pytest.mark.parametrize("empty", [False, True])
def test_a_source_with_no_input_files_is_refused_by_name_at_plan(tmp_path, sample_tokenizer, empty) -> None:
    """A source whose folder holds no input file, or only files of 0 bytes: refused at plan, naming it."""
    inputs = write_sources(tmp_path / "data", {"web": 40, "code": 20, "math": 20})
    (tmp_path / "none").mkdir()
    if empty:
        (tmp_path / "none" / "a.jsonl").write_bytes(b"")
    mixture = spec(inputs | {"math": str(tmp_path / "none")}, None)
    with pytest.raises(InputError) as refused:
        Build.start(config(tmp_path, sample_tokenizer, mixture), "none")
    held = f"{tmp_path}/none holds only empty files (1 input file of 0 bytes): no documents"
    assert (
        str(refused.value) == f"mixture source 'math': {held if empty else f'no input files found in {tmp_path}/none'}"
    )
    assert not (tmp_path / "out" / "none").exists()


def test_a_spec_files_relative_inputs_are_relative_to_its_folder(tmp_path, sample_tokenizer, monkeypatch) -> None:
    """A spec means the same files wherever it is run from: a relative local input from the spec's folder; a URL, an
    absolute path and a home-relative one as given. A spec given inline (the DAG's param) has no folder: its paths
    stay relative to the working directory."""
    inputs = write_sources(tmp_path / "specs" / "data", {"web": 40, "code": 20, "math": 20})
    (tmp_path / "specs" / "mix.yaml").write_text(
        "sources:\n"
        "  - {name: web, input: data/web/, weight: 1}\n"
        "  - {name: code, input: ./data/code, weight: 1}\n"
        "  - {name: math, input: ../specs/data/math/*.jsonl, weight: 1}\n"
        "  - {name: far, input: 's3://bucket/far/', weight: 1}\n"
        "  - {name: home, input: ~/corpus, weight: 1}\n"
        "  - {name: root, input: /corpus/root, weight: 1}\n"
    )
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    data = mixture_spec.load_mixture_file("../specs/mix.yaml")
    specs = tmp_path / "specs"
    assert [source["input"] for source in data["sources"]] == [
        f"{specs}/data/web/",
        f"{specs}/data/code",
        f"{specs}/data/math/*.jsonl",
        "s3://bucket/far/",
        "~/corpus",
        "/corpus/root",
    ]
    data["sources"] = data["sources"][:3]
    built = config(tmp_path, sample_tokenizer, data)
    listing, _ = list_inputs(built.inputs, built.source_names, None)
    assert [Path(f.url).relative_to(Path(inputs["web"]).parent).as_posix() for f in listing.files] == [
        f"{name}/part-{part}.jsonl" for name in LETTERS for part in range(2)
    ]
    inline = config(tmp_path, sample_tokenizer, {"sources": [{"name": "web", "input": "data/web", "weight": 1}]})
    assert inline.inputs == ["data/web"]


def test_a_spec_at_a_url_has_its_relative_inputs_under_its_folder() -> None:
    """A mixture file on a store (the DAG's ``mixture_file``): its relative inputs are URLs under its folder."""
    fs = fsspec.filesystem("memory")
    fs.pipe_file("/specs/night/mix.yaml", b"sources:\n  - {name: web, input: ../data/web/, weight: 1e-1}\n")
    data = mixture_spec.load_mixture_file("memory://specs/night/mix.yaml")
    assert data["sources"] == [{"name": "web", "input": "memory://specs/data/web/", "weight": 0.1}]


def test_a_remix_the_cache_can_tell_is_too_small_is_refused_at_plan(tmp_path, sample_tokenizer) -> None:
    """Every file of the sources in the cache (an earlier build's): a re-mix that asks more of code than its tokens
    allow is refused when the build is made, before any rank tokenizes, with the merge's words; a source only partly
    in the cache is left to the merge."""
    inputs = write_sources(tmp_path / "data", {"web": 200, "code": 60, "math": 100})
    first = in_process(Build.start(config(tmp_path, sample_tokenizer, spec(inputs, 5_000)), "first")).record
    code = next(account for account in first.mixture or [] if account.name == "code")
    remix = spec(inputs, 35_000)
    for source, weight in zip(remix["sources"], (0.2, 0.7, 0.1), strict=True):
        source["weight"] = weight
    with pytest.raises(mixing.MixtureShortfall) as refused:
        Build.start(config(tmp_path, sample_tokenizer, remix), "remix")
    assert str(refused.value) == (
        f"mixture source 'code' has {code.tokens_available:,} tokens, used at most 3 times: "
        f"{3 * code.tokens_available:,}; its 0.7 of the weights needs 24,500 of the 35,000: lower its weight or the "
        "budget, or raise its max_repetition"
    )
    assert not (tmp_path / "out" / "remix").exists()  # refused before the run claimed its folder
    write_jsonl(tmp_path / "data" / "code" / "part-2.jsonl", [{"text": "hij klm"}])  # code not wholly cached now
    Build.start(config(tmp_path, sample_tokenizer, remix), "unknown")  # left to the merge


def test_a_remix_tokenizes_nothing_and_the_same_spec_gives_the_same_bytes(tmp_path, sample_tokenizer) -> None:
    inputs = write_sources(tmp_path / "data")
    first = in_process(Build.start(config(tmp_path, sample_tokenizer, spec(inputs, 20_000)), "first")).record
    assert first.cache is not None and first.cache.files_missed == 6
    weights = spec(inputs, 20_000)
    for source, weight in zip(weights["sources"], (0.2, 0.3, 0.5), strict=True):
        source["weight"] = weight
    remix = in_process(Build.start(config(tmp_path, sample_tokenizer, weights), "remix")).record
    assert remix.cache is not None and remix.cache.files_missed == 0 and remix.cache.files_hit == 6
    assert [round(account.share, 2) for account in remix.mixture or []] == [0.2, 0.3, 0.5]
    again = in_process(Build.start(config(tmp_path / "again", sample_tokenizer, spec(inputs, 20_000)), "first"))
    assert again.record.digest == first.digest


def test_without_a_budget_the_weights_take_the_most_the_caps_allow(tmp_path, sample_tokenizer) -> None:
    """Code, the scarcest for its weight, is used exactly 3 times (its cap); the others at their shares of that."""
    inputs = write_sources(tmp_path / "data")
    record = in_process(Build.start(config(tmp_path, sample_tokenizer, spec(inputs, None)), "most")).record
    books = {account.name: account for account in record.mixture or []}
    assert books["code"].uses == 3 * DOCS["code"] and books["code"].tokens_chosen == 3 * books["code"].tokens_available
    assert abs(record.tokens * 0.3 - books["code"].tokens_chosen) < 50


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"shuffle_chunk_size": 64}, "a mixture mixes whole documents: no shuffle_chunk_size"),
        ({"context_mode": "packed"}, "packed windows do not"),
    ],
)
def test_options_a_mixture_cannot_carry_are_refused(tmp_path, sample_tokenizer, change, message) -> None:
    with pytest.raises(UsageError, match=message):
        config(tmp_path, sample_tokenizer, spec(write_sources(tmp_path / "data"), 1000), **change)


def test_a_file_in_two_sources_is_refused(tmp_path, sample_tokenizer) -> None:
    inputs = write_sources(tmp_path / "data")
    overlapping = spec(inputs | {"math": str(tmp_path / "data")}, 1000)  # math's folder holds code's files too
    twice = r"code/part-0.jsonl is in mixture sources 'code' and 'math': a file belongs"
    with pytest.raises(mixture_spec.MixtureError, match=twice):
        Build.start(config(tmp_path, sample_tokenizer, overlapping), "twice")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("sources: []", "no sources"),
        (
            "sources:\n  - {name: web, input: /x, wieght: 1}",
            r"sources\[0\]: 'wieght' is not a field of a mixture source \(did you mean 'weight'\?\)",
        ),
        ("sources:\n  - {name: web, input: /x, weight: 0}", "weight 0 is not a positive number"),
        ("sources:\n  - {name: a b, input: /x, weight: 1}", "a name is letters"),
        ("sources:\n  - {name: a, input: /x, weight: 1, max_repetition: 0.5}", "max_repetition 0.5 is below 1"),
        ("sources:\n  - {name: a, input: /x, weight: 1}\n  - {name: a, input: /y, weight: 1}", "named twice"),
        ("tokens: 0\nsources:\n  - {name: a, input: /x, weight: 1}", "a budget is at least 1 token"),
        ("a: [", "not YAML or JSON: line 1"),
    ],
)
def test_a_bad_mixture_file_is_one_line_naming_the_file(tmp_path, text, message) -> None:
    path = tmp_path / "mix.yaml"
    path.write_text(text)
    with pytest.raises(mixture_spec.MixtureError, match=rf"^{tmp_path}/mix.yaml: .*{message}"):
        mixture_spec.load_mixture_file(str(path))


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        ("mix.json", '{"sources": [{"name": "web", "input": "/x", "weight": 1e-1}]}', None),
        ("mix.yaml", "sources:\n  - {name: web, input: /x, weight: 1e-3}", None),
        ("mix.yaml", "tokens: 5e4\nsources:\n  - {name: web, input: /x, weight: 1E+2}", None),
        ("mix.json", '{"tokens": 5e4, "sources": [{"name": "web", "input": "/x", "weight": 1e2}]}', None),
        (
            "mix.yaml",
            "tokens: 5.5e0\nsources:\n  - {name: web, input: /x, weight: 1}",
            "tokens is 5.5: a budget is a whole number of tokens",
        ),
        ("mix.json", '{"tokens": 1', "not JSON: line 1, column 13: Expecting ',' delimiter"),
    ],
)
def test_mixture_numbers_are_read_as_json_and_yaml_1_2_read_them(tmp_path, name, text, message) -> None:
    """An exponent is a number in JSON and in YAML 1.2 (YAML 1.1's resolver read ``1e-3`` as a string); a budget
    written as one is a whole number, or refused."""
    path = tmp_path / name
    path.write_text(text)
    if message is not None:
        with pytest.raises(mixture_spec.MixtureError) as refused:
            mixture_spec.load_mixture_file(str(path))
        assert str(refused.value) == f"{path}: {message}"
        return
    data = mixture_spec.load_mixture_file(str(path))
    mixture = mixture_spec.read_mixture(data, name)
    assert mixture.sources[0].weight in (0.1, 0.001, 100.0)
    assert data.get("tokens") in (None, 50_000) and isinstance(data.get("tokens", 0), int)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "sources:\n  - {name: web, input: /x, weight: 1, max_repetition: 1e12}",
            "source 'web': max_repetition 1e+12 is above 1,000, the most a source's documents may be used",
        ),
        (
            "tokens: 1e16\nsources:\n  - {name: web, input: /x, weight: 1}",
            "tokens is 10,000,000,000,000,000: a budget is at most 1,000,000,000,000,000 tokens (10^15)",
        ),
        (
            "sources:\n  - {name: a, input: /x, weight: 1e308}\n  - {name: b, input: /x, weight: 1e308}",
            "the weights add up past the largest number: scale them down",
        ),
        (
            "tokens: 1\nsources:\n  - {name: web, input: /x, weight: 1}\n  - {name: code, input: /y, weight: 1}",
            "source 'code': its share (weight 1) of a budget of 1 token rounds to 0 tokens: raise tokens or its weight",
        ),
        (
            "sources: " + "[" * 5000 + "]" * 5000,
            DEEP,
        ),
        (
            "sources:\n  - {name: web, input: " + "[" * 300 + "]" * 300 + ", weight: 1}",
            DEEP,
        ),
        (
            "sources: &loop\n  - *loop",
            DEEP,
        ),
        (
            "sources:\x00\n",
            "not YAML or JSON: line 1, column 9: the character U+0000: special characters are not allowed",
        ),
    ],
)
def test_a_mixture_past_its_bounds_is_one_line_where_it_is_read(tmp_path, text, message) -> None:
    """A repetition or a budget no merge could hold (a 1e12 repetition asked 427 TiB after every rank tokenized), a
    source with no share of the budget, a spec nested past Python's stack or holding itself, a NUL: each one line
    naming the file, before any work."""
    path = tmp_path / "mix.yaml"
    path.write_text(text)
    with pytest.raises(mixture_spec.MixtureError) as refused:
        mixture_spec.load_mixture_file(str(path))
    assert str(refused.value) == f"{path}: {message}"


def test_a_deep_json_mixture_is_one_line(tmp_path) -> None:
    path = tmp_path / "mix.json"
    path.write_text('{"sources": ' + "[" * 100_000 + "]" * 100_000 + "}")
    with pytest.raises(mixture_spec.MixtureError) as refused:
        mixture_spec.load_mixture_file(str(path))
    assert str(refused.value) == f"{path}: {DEEP}"


def test_uses_come_within_one_mean_document_of_any_target_on_web_lengths() -> None:
    """Lengths as the web's (log-normal, a long tail): one long document at the edge must not leave a gap as long."""
    rng = np.random.default_rng(0)
    for trial in range(100):
        tokens = np.maximum(1, rng.lognormal(6, 1.2, int(rng.integers(50, 2000))).astype(np.int64))
        target = int(rng.integers(1, 3 * tokens.sum()))
        uses = mixing.uses(tokens, target, orderings.mixture_subset(trial, 0, 0, len(tokens)))
        k = target // int(tokens.sum())
        assert set(np.unique(uses)) <= {k, k + 1}
        assert abs(int((uses * tokens).sum()) - target) <= tokens.mean(), trial


def test_the_interleave_keeps_every_stretch_at_the_mixture() -> None:
    rng = np.random.default_rng(1)
    sources = np.repeat([0, 1, 2], [3000, 1000, 500])
    tokens = rng.integers(1, 1000, len(sources))
    uses = np.ones(len(sources), np.int64)
    order = mixing.interleaved(sources, tokens, uses, orderings.mixture_draws(3, 0))
    assert sorted(order.tolist()) == list(range(len(sources)))
    held = np.array([np.cumsum(np.where(sources[order] == s, tokens[order], 0)) for s in range(3)])
    whole = held[:, -1:]
    taken = held.sum(axis=0)
    drift = held - whole * taken / taken[-1]  # each source's tokens so far against its share of all so far
    assert np.abs(drift).max() <= 2 * tokens.max()


def test_budget_apportions_exactly_and_bucket_targets_add_up() -> None:
    mixture = Mixture(
        tokens=1001,
        sources=[MixtureSource(name=n, input=f"/{n}", weight=w) for n, w in (("a", 1), ("b", 1), ("c", 1))],
    )
    assert mixing.budget(mixture, [500, 500, 500]) == [334, 334, 333]
    held = np.array([[200, 150, 150], [160, 180, 160], [170, 170, 160]])
    parts = [mixing.bucket_targets(mixture, held, b) for b in range(3)]
    assert sum(map(sum, parts)) == 1001
    assert all(max(part) - min(part) <= 1 for part in parts)  # every bucket at the mixture's shares


def test_megatron_output_weighs_each_sources_files_by_its_weight(tmp_path, sample_tokenizer) -> None:
    """Megatron output is never merged: each rank writes each source's documents apart, and the data path gives
    a source's files its weight (shared by their tokens), which Megatron-LM normalizes into its blend."""
    from tokenization.formats.megatron import MegatronFile

    inputs = write_sources(tmp_path / "data", {"web": 200, "code": 60, "math": 100})
    weights = {"sources": [{"name": n, "input": inputs[n], "weight": WEIGHTS[n]} for n in LETTERS]}
    built = config(tmp_path, sample_tokenizer, weights, output_format="megatron", context_window=0, save_loss=False)
    record = in_process(Build.start(built, "blend")).record
    tokenizer = Tokenizer.from_file(str(sample_tokenizer))
    path = Path(record.dataset).parent / "megatron_data_path.txt"
    pairs = path.read_text().split()
    weight: Counter = Counter()
    for share, prefix in zip(pairs[::2], pairs[1::2], strict=True):
        source = Path(prefix).name.split("_")[2]
        ids = MegatronFile(str(path.parent / prefix)).tokens.tolist()
        assert {source_of(tokenizer.decode(ids))} == {source}  # the source's documents alone
        weight[source] += int(share)
    assert {name: round(w / sum(weight.values()), 6) for name, w in weight.items()} == WEIGHTS
    assert [account.share for account in record.mixture or []] == [0.6, 0.3, 0.1]
    with pytest.raises(UsageError, match="Megatron-LM decides how many tokens it takes of each"):
        config(tmp_path, sample_tokenizer, spec(inputs, 1000), output_format="megatron", save_loss=False)


def test_a_rank_sidecar_changed_to_another_valid_source_stops_the_merge(tmp_path, sample_tokenizer) -> None:
    """A byte of a rank's ``.source`` set to another source that exists: the sizes still match, so only its
    recorded sha256 can tell; the merge refuses before it writes a byte."""
    inputs = write_sources(tmp_path / "data", {"web": 60, "code": 20, "math": 40})
    build = Build.start(config(tmp_path, sample_tokenizer, spec(inputs, None)), "tampered")
    for rank in build.ranks:
        build.tokenize(rank, progress=False)
    sidecar = next(Path(build.layout.ranks.path).glob("*.ds.source"))
    data = bytearray(sidecar.read_bytes())
    data[0] = (data[0] + 1) % len(LETTERS)
    sidecar.write_bytes(bytes(data))
    with pytest.raises(TokenFileError, match=rf"{sidecar.name}: not the sidecar its rank recorded"):
        build.merge(progress=False)
    assert not list(Path(build.layout.merged.path).glob("*.ds"))


def test_the_merge_takes_the_mixture_the_build_read_and_records_it_typed(
    tmp_path, sample_tokenizer, monkeypatch
) -> None:
    """The build reads the mixture once (``BuildConfig.mixed``); the merge takes that ``Mixture`` and never parses
    a spec again, and its manifest records the mixture as the record it is (every field the merge used)."""
    inputs = write_sources(tmp_path / "data", {"web": 60, "code": 20, "math": 40})
    build = Build.start(config(tmp_path, sample_tokenizer, spec(inputs, None), context_window=0), "typed")
    for rank in build.ranks:
        build.tokenize(rank, progress=False)
    monkeypatch.setattr(mixture_spec, "read_mixture", lambda *_: pytest.fail("the merge parsed the mixture again"))
    build.merge(progress=False)
    recorded = MergeManifest.read(build.layout.merged, manifest_name("corpus"))
    assert build.config.mixed is not None and recorded is not None
    assert recorded.params.to_json()["mixture"] == build.config.mixed.to_json()
    assert recorded.params.to_json()["mixture"]["sources"][0]["max_repetition"] == 1  # the spec left it out: read as 1
