"""corpus-tokenization: cleaned text into datatrove's token files, shuffled at scale.

The public API, as ``tokenization.NAME``: a whole build (``Build``, ``BuildConfig``), each stage as a function and
its config, ``verify``, ``export_mds`` (a build's windows as MDS), and ``TokenFile`` to read what they write. The
layers, from the bottom: ``version``, ``errors``, ``progress``, ``storage``, ``options``, ``records``, ``orderings``,
``formats``, ``rendering``, ``inputs``, ``tokenizer``, ``output`` (the output protocol), ``stages`` and ``builds``;
each name is loaded on first use, so that importing one layer does not load them all.
"""

from __future__ import annotations

from importlib import import_module

from tokenization.version import __version__ as __version__  # the public API names it

PUBLIC = {  # name -> the module that defines it
    "Build": "tokenization.builds.run",
    "BuildConfig": "tokenization.builds.config",
    "Published": "tokenization.builds.complete",
    "TokenizeConfig": "tokenization.stages.tokenize",
    "tokenize_rank": "tokenization.stages.tokenize",
    "MergeConfig": "tokenization.stages.merge.config",
    "merge": "tokenization.stages.merge",
    "ContextShuffleConfig": "tokenization.stages.context_shuffle",
    "context_shuffle": "tokenization.stages.context_shuffle",
    "CountConfig": "tokenization.stages.count",
    "count_tokens": "tokenization.stages.count",
    "verify": "tokenization.stages.verify",
    "export_mds": "tokenization.stages.export_mds",
    "TokenFile": "tokenization.formats.ds",
    "TokenizationError": "tokenization.errors",
}
__all__ = sorted(PUBLIC)


def __getattr__(name: str) -> object:
    if name not in PUBLIC:
        raise AttributeError(f"module 'tokenization' has no attribute {name!r}")
    return getattr(import_module(PUBLIC[name]), name)


def __dir__() -> list[str]:
    return __all__
