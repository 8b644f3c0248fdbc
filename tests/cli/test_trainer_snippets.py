"""The README's "Load it in your trainer" section, run as printed: its build commands in a folder holding ``data/``,
``tokenizer.json`` and a mixture (``mixture.yaml`` and its sources), then each snippet, in the trainers' environment
(the MDS one in mosaicml streaming's), on what they built; what the snippets print is what our own readers find in
the same files, and the sources a mixture's snippet reads are those its documents' decoded text tells. Each runs on
a build of the sample tokenizer (2 bytes an id) and of Llama 3's (128,256 ids: 4 bytes an id), which a snippet
assuming either size misreads."""

from __future__ import annotations

import json
import random
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer

from tests.support.paths import ROOT, shared_path
from tests.support.references import in_streaming_env, in_trainer_env
from tokenization.formats.ds import TokenFile
from tokenization.formats.megatron import MegatronFile

SECTION = ROOT.joinpath("README.md").read_text().split("## Load it in your trainer", 1)[1].split("\n## ", 1)[0]
SNIPPETS = dict(re.findall(r"<!-- trainer snippet: (\w+) -->\n```python\n(.*?)```", SECTION, flags=re.DOTALL))
WINDOW = 2049
MEGATRON_TOKENS = {"sample": 64_522, "llama3": 55_963}  # the sample corpus's, a rank file each
TOKEN_SIZES = {"sample": 2, "llama3": 4}
# The mixture's sources: words that tell their source from any piece of a document (lower case, upper case, symbols).
WORDS = {
    "web": ["river", "stone", "garden", "window", "meadow", "lantern", "harbor"],
    "code": ["DEF", "RETURN", "LAMBDA", "CLASS", "IMPORT", "YIELD", "ASSERT"],
    "math": ["+=", "**", "<<=", "%", "//", "==", "->"],
}
DOCUMENTS = {"web": 150, "code": 15, "math": 80}  # code, too small for its share, is used twice: the budget
MIXTURE = """\
sources:
  - {name: web, input: sources/web, weight: 5}
  - {name: code, input: sources/code, weight: 3, max_repetition: 2}
  - {name: math, input: sources/math, weight: 2}
"""


@pytest.fixture(scope="module", params=sorted(MEGATRON_TOKENS))
def tokenizer(request) -> str:
    return request.param


@pytest.fixture(scope="module")
def builds(tokenizer, tmp_path_factory, sample_corpus, sample_tokenizer) -> Path:
    """A folder where the section's build commands ran, as printed, with the sample tokenizer or Llama 3's."""
    here = tmp_path_factory.mktemp(tokenizer)
    (here / "data").symlink_to(sample_corpus)
    path = sample_tokenizer if tokenizer == "sample" else shared_path("tokenizers", tokenizer, "tokenizer.json")
    (here / "tokenizer.json").symlink_to(path)
    write_mixture(here)
    section = re.search(r"```bash\n(tokenization build .*?)```", SECTION, flags=re.DOTALL)
    assert section is not None
    commands = section.group(1).splitlines()
    assert len(commands) == 3
    for command in commands:
        words = shlex.split(command)
        done = subprocess.run([sys.executable, "-m", "tokenization.cli", *words[1:]], cwd=here, capture_output=True)
        assert done.returncode == 0, done.stderr.decode()[-2000:]
    return here


def write_mixture(here: Path) -> None:
    """``mixture.yaml`` and its three sources, a JSON lines file each, of documents of 5 to 300 words."""
    rng = random.Random(0)
    for name, words in WORDS.items():
        folder = here / "sources" / name
        folder.mkdir(parents=True)
        texts = [" ".join(rng.choices(words, k=rng.randint(5, 300))) for _ in range(DOCUMENTS[name])]
        (folder / "part-0.jsonl").write_text("".join(json.dumps({"text": text}) + "\n" for text in texts))
    (here / "mixture.yaml").write_text(MIXTURE)


def told(text: str) -> str | None:
    """The source a piece's decoded text tells (None: only spaces, or an EOS alone)."""
    kinds = {"web" if c.islower() else "code" if c.isupper() else "math" for c in text if not c.isspace()}
    assert len(kinds) <= 1, f"a piece of two sources' words: {text!r}"
    return kinds.pop() if kinds else None


def test_the_section_has_its_four_snippets() -> None:
    assert sorted(SNIPPETS) == ["datatrove", "mds", "megatron", "numpy", "sources"]


def printed(builds: Path, name: str) -> list[str]:
    return in_trainer_env(SNIPPETS[name], cwd=builds).strip().splitlines()


def test_datatroves_reader_gives_windows_positions_and_the_loss_mask(builds, tokenizer) -> None:
    files, loss = read_by_datatrove(builds, "nightly")
    assert {f.token_size for f in files} == {TOKEN_SIZES[tokenizer]}
    assert files[0].loss is not None
    assert loss == int(np.asarray(files[0].loss[:WINDOW]).sum()) > 0


def test_datatroves_snippet_reads_a_build_without_loss_bytes(builds) -> None:
    """The mixture build has no --save-loss, so no ``.ds.loss``: every token carries loss, and the snippet says so
    instead of failing to open the file."""
    _, loss = read_by_datatrove(builds, "mixed")
    assert not list((builds / "builds/mixed/context").glob("*.loss"))
    assert loss == WINDOW


def read_by_datatrove(builds: Path, build: str) -> tuple[list[TokenFile], int]:
    """The datatrove snippet run on ``build``'s context files: checks the windows, first ids and positions it
    printed against our reader's; gives the files and the loss tokens it counted in the first window."""
    script = SNIPPETS["datatrove"].replace('"builds/nightly/context"', f'"builds/{build}/context"')
    (line,) = in_trainer_env(script, cwd=builds).strip().splitlines()
    files = [TokenFile(str(p)) for p in sorted((builds / f"builds/{build}/context").glob("*.ds"))]
    first = np.asarray(files[0].tokens[:WINDOW])
    ends = np.asarray(files[0].ends, dtype=np.int64)
    doc_starts = np.concatenate([[0], ends[ends < 8]])
    positions = [i - int(doc_starts[doc_starts <= i].max()) for i in range(8)]
    shown = re.fullmatch(r"(\d+) (\[.*?\]) (\[.*?\]) (\d+)", line)
    assert shown is not None, line
    count, ids, where, loss = shown.groups()
    assert int(count) == sum(f.num_tokens // WINDOW for f in files) > 0
    assert (json.loads(ids), json.loads(where)) == (first[:8].tolist(), positions)
    return files, int(loss)


def test_numpy_reads_whole_windows_and_their_loss(builds) -> None:
    lines = printed(builds, "numpy")
    paths = sorted((builds / "builds/nightly/context").glob("*.ds"))
    assert len(lines) == len(paths) > 0
    for line, path in zip(lines, paths, strict=True):
        ours = TokenFile(str(path))
        full = ours.num_tokens // WINDOW
        assert ours.loss is not None
        loss = int(np.asarray(ours.loss[: full * WINDOW]).sum())
        assert line == f"builds/nightly/context/{path.name} ({full}, {WINDOW}) {loss} {len(ours.ends)}"


def test_streaming_reads_the_mds_windows(builds, tokenizer) -> None:
    (line,) = in_streaming_env(SNIPPETS["mds"], cwd=builds).strip().splitlines()
    files = [TokenFile(str(p)) for p in sorted((builds / "builds/nightly/context").glob("*.ds"))]
    first = files[0]
    ends = np.asarray(first.ends, dtype=np.int64)
    windows = sum(-(-f.num_tokens // WINDOW) for f in files)
    ids = np.asarray(first.tokens[:8]).tolist()
    assert first.loss is not None
    loss = int(np.asarray(first.loss[:WINDOW]).sum())
    assert line == f"{windows} {ids} {ends[ends <= WINDOW].tolist()} {loss}" and loss > 0


def test_megatron_core_reads_every_prefix_of_the_data_path(builds, tokenizer) -> None:
    megatron_reads(builds, "builds/nightly-megatron", MEGATRON_TOKENS[tokenizer])


def test_a_moved_megatron_build_is_read_by_its_data_path(builds, tokenizer, tmp_path) -> None:
    """The build's folder moved (not copied: the old place must not be read): the snippet reads every prefix from
    the new place, and the README's command gives Megatron absolute prefixes there, from another folder."""
    moved = tmp_path / "elsewhere" / "nightly-megatron"
    moved.parent.mkdir()
    shutil.move(builds / "builds/nightly-megatron", moved)
    try:
        megatron_reads(builds, str(moved), MEGATRON_TOKENS[tokenizer])
        snippet = re.search(r"<!-- megatron data path -->\n```bash\n(.*?)```", SECTION, flags=re.DOTALL)
        assert snippet is not None
        command = snippet.group(1)
        assert "builds/nightly-megatron" in command
        script = "python() { printf '%s\\n' \"$@\"; }\n" + command.replace("builds/nightly-megatron", str(moved))
        done = subprocess.run(["bash", "-c", script], cwd=tmp_path, capture_output=True, text=True, check=True)
        args = done.stdout.splitlines()
        words = args[args.index("--data-path") + 1 : args.index("--split")]
        relative = (moved / "megatron_data_path.txt").read_text().split()
        assert words[::2] == relative[::2]
        assert words[1::2] == [str(moved / prefix) for prefix in relative[1::2]]
        assert all(MegatronFile(prefix).num_tokens == int(w) for w, prefix in zip(words[::2], words[1::2], strict=True))
    finally:
        shutil.move(moved, builds / "builds/nightly-megatron")


def megatron_reads(builds: Path, run: str, tokens: int) -> None:
    """The megatron snippet, run on the build at ``run``, reads each prefix its data path names (relative to the
    build's folder), with the tokens our reader finds there and its weight."""
    script = SNIPPETS["megatron"].replace('"builds/nightly-megatron"', repr(run))
    assert script != SNIPPETS["megatron"]
    lines = in_trainer_env(script, cwd=builds).strip().splitlines()
    folder = builds / run  # (an absolute run stays itself)
    words = (folder / "megatron_data_path.txt").read_text().split()
    prefixes = words[1::2]
    assert len(lines) == len(prefixes) == 4  # a prefix a rank
    assert sum(map(int, words[::2])) == tokens
    for line, weight, prefix in zip(lines, words[::2], prefixes, strict=True):
        assert prefix.startswith("./ranks/")  # relative to the build's folder: a moved build still reads
        ours = MegatronFile(str(folder / prefix))
        first = np.asarray(ours.tokens[: int(ours.lengths[0])])[:8].tolist()
        assert line == f"{prefix} {weight} {len(ours.lengths)} {first}" and int(weight) == ours.num_tokens


def test_a_mixtures_sources_are_read_a_piece_at_a_time(builds) -> None:
    """Each piece's source, as the snippet reads it, is the one its decoded text tells; the sources' tokens add up
    to what the build record says each gave."""
    lines = printed(builds, "sources")
    paths = sorted((builds / "builds/mixed/context").glob("*.ds"))
    assert len(lines) == len(paths) > 0
    decoder = Tokenizer.from_file(str(builds / "tokenizer.json"))
    accounts = json.loads((builds / "builds/mixed/_BUILD.json").read_text())["mixture"]
    totals = dict.fromkeys(WORDS, 0)
    for line, path in zip(lines, paths, strict=True):
        ours = TokenFile(str(path))
        assert ours.metadata is not None
        names = list(ours.metadata.sources)
        assert names == list(WORDS)
        tokens, ends = np.asarray(ours.tokens), np.asarray(ours.ends, dtype=np.int64)
        starts = np.concatenate([[0], ends[:-1]])
        sources = [names[k] for k in np.asarray(ours.sources)]
        assert len(sources) == len(ends) > 8
        for start, end, source in zip(starts, ends, sources, strict=True):
            text = decoder.decode(tokens[start:end].tolist(), skip_special_tokens=True)
            assert told(text) in (source, None) and (told(text) or end - start <= 2), (path.name, start, text)
        tokens_of = {name: int((ends - starts)[np.array(sources) == name].sum()) for name in names}
        assert line == f"builds/mixed/context/{path.name} {tokens_of} {sources[:8]}"
        totals = {name: totals[name] + tokens_of[name] for name in names}
    assert totals == {account["name"]: account["tokens_chosen"] for account in accounts}
    code = accounts[list(WORDS).index("code")]  # the budget, the largest the weights allow: code used twice over
    assert code["docs_repeated"] == code["docs_chosen"] == DOCUMENTS["code"] and code["uses"] == 2 * DOCUMENTS["code"]
