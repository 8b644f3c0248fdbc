"""``tokenization verify PATH`` of a build's run folder: its dataset verified (``stages.verify``), then held against
the build record (tokens and digest), its chain checked again from its records (``audit``), and the MDS copy
publish wrote, if any. Any other folder is verified as it is. The command line only parses and prints."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from tokenization.builds.accounting import dataset_digest
from tokenization.builds.audit import chain_problems
from tokenization.formats.block_checks import Report
from tokenization.output.runs import BUILD_MANIFEST, RUN_CLAIM, BuildError, Layout, read_build
from tokenization.records import BuildRecord
from tokenization.stages.export_mds import mds_problems
from tokenization.stages.verify import verify
from tokenization.storage.folder import Folder
from tokenization.wording import counted


def verify_path(
    path: Folder, tokenizer: str | None, eos_token: str | None, sample: int | None, say: Callable[[str], None]
) -> tuple[Report, Folder]:
    """The report of ``path`` (a build's run folder: its dataset and its chain; else the folder itself) and the
    folder whose token files it checked. ``sample``: the documents encoded again a file (None: every file read
    whole, nothing vouched for); ``say`` tells what is verified as it goes."""
    build = _build_in(path, say)
    dataset = path.sub(Folder(build.dataset).name) if build else path
    report = verify(dataset, tokenizer, eos_token, vouched=sample is not None, sample=sample or 0)
    if build is None:
        return report, dataset
    if build.tokens != report.tokens or build.digest not in _digests(dataset, build):
        report.problems.append(
            f"{path.url_of(BUILD_MANIFEST)}: records {build.tokens:,} tokens and digest {build.digest}, but its "
            f"dataset holds {report.tokens:,} tokens and digest {next(_digests(dataset, build))}"
        )
    report.problems.extend(chain_problems(path, build, report.tokens))
    if build.mds:
        report.problems.extend(_mds_problems(path, build, read=sample is None, say=say))
    return report, dataset


def _digests(dataset: Folder, build: BuildRecord) -> Iterator[str]:
    """What the build record's digest may be: the dataset's; for a build published before the digest named the
    tokenizer by its sha256, that of the dataset's bytes themselves (``accounting.dataset_digest``)."""
    yield dataset_digest(dataset, build.tokenizer.sha256)
    yield dataset_digest(dataset, None)


def _mds_problems(run: Folder, build: BuildRecord, read: bool, say: Callable[[str], None]) -> list[str]:
    """A build that publish also wrote as MDS: its index and shards against the record (``stages.export_mds``)."""
    assert build.mds is not None
    mds = Layout(run).mds
    problems = mds_problems(build.mds, mds, read)
    if not problems:
        say(f"{mds.url}: {counted(build.mds.shards, 'MDS shard')} as the build record says")
    return problems


def _build_in(run: Folder, say: Callable[[str], None]) -> BuildRecord | None:
    """The build record of a run folder, whose dataset is what to verify (and whose record must match it); None
    for any other folder. Its dataset is the one in ``run`` named as the record names it: a run folder copied or
    moved since would otherwise verify the original's (or none)."""
    if not run.exists(RUN_CLAIM):
        return None
    build = read_build(run)
    if build is None:
        stages = [stage.url for stage in Layout(run).stages.values() if stage.is_folder()]
        raise BuildError(
            f"{run.url} is the run folder of a build not published yet: verify one of its stage folders "
            f"({', '.join(stages) or 'none written yet'})"
        )
    say(f"{run.url} is a build's run folder: verifying its dataset")
    return build
