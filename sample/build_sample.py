"""Rebuild the bundled sample: ``sample/corpus/*.jsonl.gz`` and ``sample/tokenizer.json``.

The corpus is real text that every Python installation carries: the docstrings of standard-library modules,
classes and functions (PSF License), plus a few hand-written records that exercise what real corpora contain:
an empty document, U+2028 inside a JSON string, literal special-token text, non-Latin scripts and emoji, and
prompt/response records with ``no_loss_ranges``. The tokenizer is a small byte-level BPE (4,096 ids,
``<|endoftext|>`` at id 0) trained on that corpus with HuggingFace ``tokenizers``.

The committed files are what the demo and the tests use; run this only to regenerate them:
``python sample/build_sample.py``.
"""

from __future__ import annotations

import gzip
import importlib
import inspect
import json
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

HERE = Path(__file__).parent
MODULES = [
    "abc",
    "argparse",
    "asyncio",
    "base64",
    "bisect",
    "calendar",
    "collections",
    "contextlib",
    "csv",
    "dataclasses",
    "datetime",
    "decimal",
    "difflib",
    "email",
    "enum",
    "fractions",
    "functools",
    "glob",
    "gzip",
    "hashlib",
    "heapq",
    "html",
    "http.client",
    "imaplib",
    "inspect",
    "io",
    "ipaddress",
    "itertools",
    "json",
    "logging",
    "mailbox",
    "math",
    "mimetypes",
    "operator",
    "os",
    "pathlib",
    "pickle",
    "pprint",
    "queue",
    "random",
    "re",
    "sched",
    "secrets",
    "shlex",
    "shutil",
    "smtplib",
    "socket",
    "sqlite3",
    "statistics",
    "string",
    "struct",
    "subprocess",
    "tarfile",
    "tempfile",
    "textwrap",
    "threading",
    "time",
    "timeit",
    "tokenize",
    "traceback",
    "typing",
    "unittest",
    "urllib.parse",
    "uuid",
    "warnings",
    "weakref",
    "xml.dom.minidom",
    "zipfile",
    "zlib",
]
MIN_CHARS = 300
FILES = 4
PROMPTS = [
    ("Summarise what a context manager does.", "It runs setup code on entry and cleanup code on exit."),
    ("Which module parses command-line options?", "The argparse module builds parsers from declarations."),
    ("Name a queue that orders items by priority.", "heapq keeps a list ordered as a binary heap."),
]
SPECIAL_RECORDS = [
    {"id": "special/empty", "text": ""},
    {"id": "special/line-separator", "text": "One record, one line:\u2028this U+2028 is inside the string.\u2029"},
    {"id": "special/eos-literal", "text": "A document may quote <|endoftext|> literally; it is text, not a token."},
    {"id": "special/multilingual", "text": "Привет, мир. こんにちは世界。مرحبا بالعالم. Γειά σου κόσμε. 你好，世界。"},
    {"id": "special/emoji", "text": "Emoji sequences: 👩‍👩‍👧‍👦 family, 👍🏽 thumbs up, 🇯🇵 flag, 1️⃣ keycap."},
    {
        "id": "special/nested",
        "text": "Top-level text of a record that also has nested metadata.",
        "meta": {"source": "hand-written", "lang": "en"},
    },
]


def docstring_records() -> list[dict]:
    """One record per documented public object, in a fixed order, deduplicated by text."""
    seen: set[str] = set()
    records = []
    for name in MODULES:
        module = importlib.import_module(name)
        public = sorted(
            (f"{name}.{attr}", getattr(module, attr))
            for attr in dir(module)
            if not attr.startswith("_")
            and (inspect.isclass(getattr(module, attr)) or inspect.isfunction(getattr(module, attr)))
        )
        objects = [(name, module), *public]
        for qualname, obj in objects:
            doc = inspect.getdoc(obj) or ""
            if (
                len(doc) >= MIN_CHARS
                and doc not in seen
                and getattr(obj, "__module__", name).startswith(name.split(".")[0])
            ):
                seen.add(doc)
                records.append({"id": f"python-stdlib-docstrings/{qualname}", "text": doc, "source": "cpython"})
    return records


def prompt_records() -> list[dict]:
    records = []
    for i, (prompt, response) in enumerate(PROMPTS):
        head = f"### Instruction:\n{prompt}\n### Response:\n"
        records.append({"id": f"instruct/{i}", "text": head + response, "no_loss_ranges": [[0, len(head)]]})
    return records


def build_corpus(records: list[dict]) -> None:
    out = HERE / "corpus"
    out.mkdir(exist_ok=True)
    for k in range(FILES):
        lines = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records[k::FILES])
        with open(out / f"part-{k:05d}.jsonl.gz", "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as gz:
            gz.write(lines.encode("utf-8"))


def build_tokenizer(records: list[dict]) -> None:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=4096,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator((r["text"] for r in records), trainer=trainer)
    tokenizer.save(str(HERE / "tokenizer.json"))


def main() -> None:
    records = docstring_records() + prompt_records() + SPECIAL_RECORDS
    build_corpus(records)
    build_tokenizer(records)
    print(f"{len(records)} records in {FILES} files, tokenizer with 4096 ids")


if __name__ == "__main__":
    main()
