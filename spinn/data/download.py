"""Fetch an official NLI corpus archive into data/raw, verified and safely extracted.

The archives are large (SNLI ~94 MB, MultiNLI ~227 MB) and come from academic
servers that drop connections, so the download resumes from a `.part` file, and
nothing reaches the final name until its checksum matches (spinn.data.fetch). Extraction refuses
archives whose members would escape the target folder ("zip slip") before it
writes a single byte, and writes every member atomically, so an interrupted run
never leaves a half file that a later stage would mistake for data.
"""

from __future__ import annotations

import re
import shutil
import stat
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from spinn.data.fetch import CHUNK_SIZE, Checksum, DownloadError, ensure_archive
from spinn.data.limits import check_members
from spinn.ground.io import atomic_path, publishing
from spinn.ground.paths import plain_file_name
from spinn.ground.settings import Conflict, Settings, env_default

DEFAULT_RAW_DIR = Path("data/raw")
MARKER_TEMPLATE = ".{filename}.extracted"
MACOS_JUNK_PREFIX = "__MACOSX/"
DRIVE_LETTER = re.compile(r"^[A-Za-z]:")
UNIX_MODE_SHIFT = 16
"""A zip entry keeps its Unix mode (file type bits included) in the high 16 bits of external_attr."""


@dataclass(frozen=True)
class Corpus:
    """Where an official corpus archive lives and what it must hash to."""

    name: str
    url: str
    filename: str
    checksum: Checksum
    splits: dict[str, str]
    """The pipeline's train / dev / test splits -> their files inside the archive."""


CORPORA: dict[str, Corpus] = {
    "snli": Corpus(
        name="snli",
        url="https://nlp.stanford.edu/projects/snli/snli_1.0.zip",
        filename="snli_1.0.zip",
        checksum=Checksum("sha256", "afb3d70a5af5d8de0d9d81e2637e0fb8c22d1235c2749d83125ca43dab0dbd3e"),
        splits={"train": "snli_1.0_train.jsonl", "dev": "snli_1.0_dev.jsonl", "test": "snli_1.0_test.jsonl"},
    ),
    "multinli": Corpus(
        name="multinli",
        url="https://cims.nyu.edu/~sbowman/multinli/multinli_1.0.zip",
        filename="multinli_1.0.zip",
        checksum=Checksum("sha256", "049f507b9e36b1fcb756cfd5aeb3b7a0cfcb84bf023793652987f7e7e0957822"),
        # MultiNLI's test labels are not public: the mismatched dev set is the held-out test.
        splits={
            "train": "multinli_1.0_train.jsonl",
            "dev": "multinli_1.0_dev_matched.jsonl",
            "test": "multinli_1.0_dev_mismatched.jsonl",
        },
    ),
}


@dataclass(frozen=True)
class DownloadResult:
    """What `download_corpus` did, so the CLI can report it without re-reading disk."""

    archive: Path
    extracted_to: Path
    fetched: bool
    members: int


CorpusName = Literal["snli", "multinli"]


DOWNLOAD_VARIABLES = {"url": "SPINN_DOWNLOAD_URL", "file": "SPINN_DOWNLOAD_FILE", "checksum": "SPINN_DOWNLOAD_CHECKSUM"}
"""The environment variables that set these settings: how they are given under `dvc repro`, whose stage
command is fixed in dvc.yaml."""


def variable_name(setting: str) -> str:
    """A setting as `dvc repro` users give it: its variable (`file` -> the SPINN_DOWNLOAD_FILE variable)."""
    variable = DOWNLOAD_VARIABLES.get(setting)
    return f"the {variable} variable" if variable else f"{setting} in params.yaml"


class DownloadSettings(Settings):
    """Which corpus, and where its archive comes from."""

    section: ClassVar[str] = "download"

    corpus: CorpusName = "snli"
    """The official corpus to fetch."""
    archive: str | None = None
    """The archive's file name in the raw folder (default: the official one, e.g. snli_1.0.zip)."""
    url: str | None = Field(default_factory=env_default(DOWNLOAD_VARIABLES["url"]))
    """A mirror of the archive instead of the official address."""
    file: Path | None = Field(default_factory=env_default(DOWNLOAD_VARIABLES["file"]), validate_default=True)
    """A local copy of the archive instead of fetching it."""
    checksum: str | None = Field(default_factory=env_default(DOWNLOAD_VARIABLES["checksum"]))
    """Expected digest, sha256:HEX or md5:HEX (default: the published one)."""

    @field_validator("checksum")
    @classmethod
    def _checksum_parses(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                Checksum.parse(value)
            except DownloadError as error:
                raise ValueError(str(error)) from None
        return value

    @model_validator(mode="after")
    def _one_source(self) -> DownloadSettings:
        if self.url is not None and self.file is not None:
            raise Conflict("give url (a mirror) or file (a local copy), not both", "url", "file")
        return self

    @property
    def archive_name(self) -> str:
        return self.archive or lookup_corpus(self.corpus).filename


def for_chosen_corpus(settings: DownloadSettings, written: DownloadSettings, archive_given: bool) -> DownloadSettings:
    """`settings` where a command line or a flow request chose another corpus than the params file's
    (`written`): the params file's archive names that other corpus's file (snli_1.0.zip), so the chosen
    corpus is saved under its own name unless an archive was given with it."""
    if settings.corpus == written.corpus or archive_given:
        return settings
    return settings.replace(archive=lookup_corpus(settings.corpus).filename)


def download(
    raw_dir: Path, settings: DownloadSettings, *, extract: bool = True, progress: bool = True
) -> DownloadResult:
    """The download stage: the corpus's verified archive in raw_dir (and its members, with extract)."""
    return download_corpus(
        settings.corpus,
        raw_dir,
        url=settings.url,
        file=settings.file,
        checksum=settings.checksum,
        archive=settings.archive_name,
        extract=extract,
        progress=progress,
    )


def download_corpus(
    name: str,
    raw_dir: Path = DEFAULT_RAW_DIR,
    *,
    url: str | None = None,
    file: Path | None = None,
    checksum: str | None = None,
    archive: str | None = None,
    extract: bool = True,
    progress: bool = True,
) -> DownloadResult:
    """Make sure `raw_dir` holds the verified archive of corpus `name` and, optionally, its members.

    A mirror (`url`) or local copy (`file`) replaces the official source but not
    the published checksum, unless `checksum` overrides it too.
    """
    corpus = lookup_corpus(name)
    if url is not None and file is not None:
        raise DownloadError(f"{corpus.filename}: give a mirror URL or a local file, not both")
    expected = Checksum.parse(checksum) if checksum is not None else corpus.checksum
    raw_dir = Path(raw_dir)
    archive = raw_dir / plain_file_name(archive or corpus.filename, "archive")
    with publishing((archive,), inputs=(file,) if file is not None else ()):
        fetched = ensure_archive(archive, expected, url=url or corpus.url, file=file, progress=progress)
        members = extract_once(archive, raw_dir, expected) if extract else 0
    return DownloadResult(archive=archive, extracted_to=raw_dir, fetched=fetched, members=members)


def lookup_corpus(name: str) -> Corpus:
    """Resolve a corpus name, listing the known ones so a typo is easy to fix."""
    corpus = CORPORA.get(name.strip().lower())
    if corpus is None:
        raise DownloadError(f"unknown corpus {name!r}: expected one of {', '.join(sorted(CORPORA))}")
    return corpus


def marker_path(archive: Path, target: Path) -> Path:
    """Name the file that records which archive version was extracted into `target`."""
    return target / MARKER_TEMPLATE.format(filename=archive.name)


def extract_once(archive: Path, target: Path, checksum: Checksum) -> int:
    """Extract unless the marker says this exact archive was extracted and its files are all still there.

    The marker (the checksum, then one extracted file per line) is written only
    after every member landed, so an interrupted or failed extraction, or a
    deleted data file, is redone on the next run. Returns members written.
    """
    marker = marker_path(archive, target)
    if marker.is_file():
        recorded = marker.read_text(encoding="utf-8").splitlines()
        if recorded[:1] == [str(checksum)] and all((target / name).is_file() for name in recorded[1:]):
            return 0
    names = extract_zip(archive, target)
    with atomic_path(marker) as temporary:
        temporary.write_text("\n".join([str(checksum), *names]) + "\n", encoding="utf-8")
    return len(names)


def extract_zip(archive: Path, target: Path) -> list[str]:
    """Extract every safe member of `archive` into `target`, refusing the whole archive if one is unsafe.

    Returns the names of the files written (directories left out).

    All names are checked before anything is written, so a hostile archive
    leaves the folder exactly as it was.
    """
    try:
        with zipfile.ZipFile(archive) as bundle:
            members = [info for info in bundle.infolist() if not is_junk(info)]
            check_members(archive, members, extract_to=target)
            plan = [(info, member_destination(info, target, archive)) for info in members]
            for info, destination in plan:
                write_member(bundle, info, destination, archive)
    except (zipfile.BadZipFile, zlib.error, EOFError) as exc:
        raise DownloadError(
            f"{archive.name}: corrupt zip archive ({exc}); expected a readable zip, "
            "delete it and rerun to fetch it again"
        ) from exc
    return [info.filename for info in members if not info.is_dir()]


def is_junk(info: zipfile.ZipInfo) -> bool:
    """Skip macOS resource-fork folders, which hold no corpus data."""
    return info.filename.startswith(MACOS_JUNK_PREFIX)


def member_destination(info: zipfile.ZipInfo, target: Path, archive: Path) -> Path:
    """Map a member name to a path inside `target`, or refuse it if it could land anywhere else."""
    name = info.filename
    windows = PureWindowsPath(name)
    parts = re.split(r"[\\/]", name)
    problem = None
    if is_symlink(info):
        problem = "is a symbolic link"
    elif PurePosixPath(name).is_absolute() or windows.is_absolute() or name.startswith("\\"):
        problem = "has an absolute path"
    elif DRIVE_LETTER.match(name) or windows.drive:
        problem = "names a drive"
    elif ".." in parts:
        problem = "climbs out with '..'"
    root = target.resolve()
    destination = (root / name).resolve()
    if problem is None and not destination.is_relative_to(root):
        problem = "resolves outside the target folder"
    if problem is not None:
        raise DownloadError(
            f"{archive.name}: member {name!r} {problem}; expected every member inside {target}, nothing extracted"
        )
    return destination


def is_symlink(info: zipfile.ZipInfo) -> bool:
    """Detect symlink entries, which could point extraction anywhere on disk."""
    return stat.S_ISLNK(info.external_attr >> UNIX_MODE_SHIFT)


def write_member(bundle: zipfile.ZipFile, info: zipfile.ZipInfo, destination: Path, archive: Path) -> None:
    """Write one member atomically, so a crash never leaves a truncated data file under its real name."""
    try:
        if info.is_dir():
            destination.mkdir(parents=True, exist_ok=True)
            return
        destination.parent.mkdir(parents=True, exist_ok=True)
        with bundle.open(info) as source, atomic_path(destination) as temporary, temporary.open("wb") as handle:
            shutil.copyfileobj(source, handle, CHUNK_SIZE)
    except OSError as exc:
        raise DownloadError(
            f"{archive.name}: cannot write member {info.filename!r} to {destination} ({exc}); "
            "expected a writable folder"
        ) from exc
