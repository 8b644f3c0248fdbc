"""Where a merge resumes: each file it publishes carries a manifest of where in the ordering it ends
(``Checkpoints``), and a merge run again keeps the files an earlier run of the same merge finished and removes the
rest."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Literal, cast

from tokenization.formats import sidecar
from tokenization.formats.checks import OwnCheck
from tokenization.formats.contents import Contents
from tokenization.formats.ds import (
    Observer,
    WrittenTokenFile,
)
from tokenization.output import manifest
from tokenization.output.attempts import Attempt
from tokenization.records import (
    ContentsSum,
    MergeOutput,
    PseudoEnds,
    RecordError,
)
from tokenization.stages.merge.config import MergeConfig
from tokenization.stages.merge.plan import Prepared
from tokenization.storage.folder import Folder

log = logging.getLogger(__name__)


class Checkpoints:
    """The ``on_close`` of the merge's writer: publishes each finished file with a manifest that records where in
    the ordering it ends, which is where a resumed merge starts."""

    def __init__(self, attempt: Attempt, prepared: Prepared, done: list[MergeOutput], own: OwnCheck | None):
        self.attempt, self.prepared, self.entries, self.own = attempt, prepared, list(done), own
        self.resumed_units = self.units_end

    @property
    def units_end(self) -> int:
        return self.entries[-1].units_end if self.entries else 0

    @property
    def tokens(self) -> int:
        return sum(entry.tokens for entry in self.entries)

    @property
    def contents(self) -> Contents:
        """Of the files published so far, this attempt's and those it resumed after."""
        # cast: each has its contents (this attempt's are made with them; resumed ones without are done again)
        return Contents.total(cast(ContentsSum, entry.contents).value for entry in self.entries)

    def _pseudo_ends(self, tokens: int) -> PseudoEnds | Literal["unknown"] | None:
        """The chunk ends in the index of the next file, of ``tokens`` tokens ("unknown": some input's index held
        chunk or window ends already)."""
        if self.prepared.inputs.pseudo_ends:
            return "unknown"
        chunk = self.prepared.units.chunk
        return manifest.pseudo_ends(self.tokens, tokens, chunk, int(self.prepared.units.counts.sum()) * (chunk or 0))

    def watch(self, path: Path) -> Observer:
        """The own check's observer of the next file as it is written: its length is not known yet, but any length
        past its end gives its chunk ends, and the whole stream's is one."""
        if self.own is None:  # the writer is given this observer only with an own check
            raise RuntimeError("the merge watches its files only with an own check")
        return self.own.watch(path, self._pseudo_ends(self.prepared.total_tokens))

    def __call__(self, written: WrittenTokenFile, units_written: int) -> None:
        units_end = self.resumed_units + units_written
        if (mix := self.prepared.mix) is not None:  # the file's uses are its documents: each one's source
            (written,) = sidecar.attach([written], mix.sources[mix.order[self.units_end : units_end]], mix.names)
        entry = manifest.output_entry(
            written,
            MergeOutput,
            fingerprint=self.prepared.fingerprint,
            units_start=self.units_end,
            units_end=units_end,
            pseudo_ends=self._pseudo_ends(written.tokens),
        )
        if self.own is not None:
            self.own.family(written.path.parent, entry)
        self.attempt.place_families([written])
        self.attempt.write(manifest.manifest_name(written.path.stem), entry.dumps())
        self.entries.append(entry)


def completed_files(attempt: Attempt, config: MergeConfig, width: int, fingerprint: str) -> list[MergeOutput]:
    """The output files a previous run of this same merge finished, in order; everything after them (and all of
    a different merge's files under this name) is removed. A damaged checkpoint is where the merge resumes."""
    done: list[MergeOutput] = []
    while True:
        name = config.file_name(len(done), width)
        try:
            entry = MergeOutput.read(attempt.output, manifest.manifest_name(name[: -len(".ds")]))
        except RecordError as exc:
            log.warning("%s: the merge resumes here", exc)
            break
        if not entry or entry.fingerprint != fingerprint or not _files_intact(attempt.output, entry):
            break
        if entry.contents is None:  # written before contents were recorded: done again, so they are checked
            break
        done.append(entry)
    remove_outputs(attempt, config, keep={n for e in done for n in e.files} | {f"{config.save_filename}.ds.metadata"})
    return done


def remove_outputs(attempt: Attempt, config: MergeConfig, keep: set[str]) -> None:
    """Remove every file and checkpoint of this merge's outputs (of any attempt) but those in ``keep``."""
    for name in attempt.output.list():
        if config.owns(name) and name not in keep:
            attempt.remove(name)
    for name in attempt.output.sub("_manifests").list():
        family = name.removesuffix(".json") + ".ds"
        if config.owns(family) and family not in keep:
            attempt.remove(f"_manifests/{name}")


def _files_intact(output: Folder, entry: MergeOutput) -> bool:
    return all(output.exists(name) and output.size(name) == info.bytes for name, info in entry.files.items())
