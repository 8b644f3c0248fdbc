"""The merge's options and config: what a merge task is given, and which of it decides the bytes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from tokenization.errors import UsageError
from tokenization.formats import names
from tokenization.formats.source_pool import MAX_OPEN_FILES
from tokenization.options import Options, option
from tokenization.records import Mixture

DEFAULT_MAX_TOKENS_PER_FILE = 100_000_000_000  # datatrove's default: 100 GT
IRRELEVANT_TO_BYTES = ("input", "output", "local_working_dir", "max_open_files", "storage_options", "choice")


@dataclass(frozen=True, kw_only=True)
class MergeOptions(Options):
    """Merge: how the rank files are ordered into merged files (merge and build share these)."""

    merge_mode: Literal["interleave", "shuffle", "bucketed"] = option(
        "interleave",
        title="Merge order",
        help="interleave: datatrove's random interleave of the rank files, each file's order kept (datatrove's "
        "bytes); shuffle: a uniform permutation of every unit of every file, in one task; bucketed: the same, in a "
        "task a bucket (of ranks tokenized with num_buckets)",
    )
    merge_max_tokens_per_file: int = option(
        DEFAULT_MAX_TOKENS_PER_FILE,
        minimum=1,
        title="Most tokens a merged file",
        help="close a merged file once it holds this many tokens, at the end of a document or chunk",
    )


@dataclass(frozen=True, kw_only=True)
class MergeConfig(MergeOptions):
    """The global merge: every rank file of a folder, reordered into one sequence of files."""

    input: str = option(flag="", help="folder or fsspec URL holding the rank .ds files (and their markers)")
    output: str = option(help="output folder or fsspec URL")
    save_filename: str = option(help="name of the merged dataset: files are NNN_{name}.ds")
    seed: int = option(0, minimum=0, help="ordering seed: the same seed gives the same bytes")
    bucket: int | None = option(None, minimum=0, help="with --merge-mode bucketed: the bucket this task merges")
    shuffle: bool = option(
        True,
        flag="--no-shuffle",
        help="reorder (--no-shuffle concatenates in file order)",
        flag_help="concatenate the files in file order (default: reorder them)",
    )
    shuffle_chunk_size: int | None = option(
        None, minimum=1, help="move fixed chunks of this many tokens instead of documents (default: documents)"
    )
    drop_last_chunk: bool = option(False, help="drop each file's partial last chunk, as datatrove does (counted)")
    save_loss: bool = option(False, help="merge the .ds.loss files too (every input must have one)")
    local_working_dir: str | None = option(
        None, help="local folder for staging and for copies of remote inputs (default: the system's temp)"
    )
    max_open_files: int = option(MAX_OPEN_FILES, minimum=1, help="input files held open at once")
    mixture: Mixture | None = option(
        None,
        cli=False,
        help="a build's mixture, read and checked once by the build (``BuildConfig.mixed``): the merge chooses and "
        "interleaves its sources (tokenization.mixing)",
    )
    choice: str | None = option(
        None,
        cli=False,
        help="a build's folder of the choice its plan made of the mixture's documents, where it made one: the ranks "
        "wrote only the chosen ones (tokenization.builds.choice)",
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if (self.merge_mode == "bucketed") != (self.bucket is not None):
            raise UsageError("merge_mode bucketed and bucket go together: give both or neither")
        if self.merge_mode == "bucketed" and self.shuffle_chunk_size:
            raise UsageError("a bucketed merge moves documents: no shuffle_chunk_size")
        if self.mixture is not None and (self.shuffle_chunk_size or not self.shuffle):
            raise UsageError("a mixture's merge interleaves whole documents: no shuffle_chunk_size, no --no-shuffle")

    @property
    def stem(self) -> str:
        return names.merge_stem(self.save_filename, self.bucket)

    def file_name(self, number: int, width: int) -> str:
        return names.merged_file_name(self.save_filename, number, width, self.bucket)

    def owns(self, name: str) -> bool:
        """Whether a file (of any family member, of any attempt) is one of this merge's outputs."""
        prefix = names.merged_prefix(self.bucket)
        number, _, rest = name.removeprefix(prefix).partition("_")
        ours = rest == f"{self.save_filename}.ds" or rest.startswith(f"{self.save_filename}.ds.")
        return name.startswith(prefix) and number.isdigit() and len(number) >= 3 and ours
