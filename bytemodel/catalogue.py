"""Named real datasets: where each comes from, and fetching it offline-first with checksums.

The catalogue (datasets/catalogue.json at the top of the repository, bytemodel/datasets/ when
installed) lists for each dataset its data type, the reader that
suits it, its licence, and its sources in the order they are tried:

- ``shipped``: a file shipped beside the catalogue (datasets/); public-domain samples only.
- ``debian``:  files of an installed Debian package, each with its SHA-256; or the files matching
               ``glob`` under ``base`` (symlinks skipped; ``**`` spans folders) with a ``count`` and a ``tree_sha256``
               (SHA-256 of the sorted lines "<path relative to base> <sha256 of the file>\\n"); ``also``
               may list other package versions' trees ({version, count, tree_sha256}) that are
               accepted too (a Debian point release that changed a file), each checksummed whole.
- ``local``:   a file every Linux machine has (e.g. an ELF executable); machine-specific, so it
               has no checksum and is copied as found.
- ``derived``: made from another dataset by a fixed recipe (``zstd-19``: compress its first file
               with zstd level 19); verified by the SHA-256 of the input content.
- ``url``:     a public URL with the SHA-256 of the bytes; used only when the caller asks for a
               download (``get(..., download=True)``, ``bytemodel data get NAME --download``).

``get(name)`` copies the first source that is present and matches its checksums into the cache
(``$BYTEMODEL_CACHE``, else ``$XDG_CACHE_HOME/bytemodel``, else ``~/.cache/bytemodel``) under
``datasets/<name>/`` and returns that directory (or into ``dest``). A file that is present but
differs from the catalogue is never used. When no source works, DatasetError says in one line what
to install (the Debian package) or to add --download.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from glob import glob
from pathlib import Path
from typing import Any

from .errors import BytemodelError, named
from .resources import datasets_dir

CATALOGUE = "catalogue.json"
MARKER = ".bytemodel-dataset.json"  # written last into a dataset folder: it is complete
DOWNLOAD_TIMEOUT_S = 60             # per network read; a stalled server fails instead of hanging


class DatasetError(BytemodelError):
    """A dataset is unknown, not available on this machine, or fails its checksum."""


@dataclass
class Dataset:
    name: str
    type: str                   # dna | text | audio | image | binary | zstd
    reader: str                 # reader spec that suits it, e.g. "fasta" or "text:sep=%"
    licence: str
    description: str
    size: str                   # human-readable size of the content, e.g. "48.5 kB"
    sources: list[dict] = field(default_factory=list)

    @property
    def packages(self) -> list[str]:
        return [s["package"] for s in self.sources if s.get("kind") == "debian"]


def cache_root() -> Path:
    """Where fetched datasets are kept."""
    if os.environ.get("BYTEMODEL_CACHE"):
        return Path(os.environ["BYTEMODEL_CACHE"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "bytemodel"


def load_catalogue(path: str | os.PathLike | None = None) -> dict[str, Dataset]:
    """name -> Dataset, in catalogue order."""
    p = Path(path) if path else datasets_dir() / CATALOGUE
    try:
        raw = json.loads(p.read_text(encoding="utf-8"))
        out = {}
        for d in raw["datasets"]:
            ds = Dataset(**d)
            out[ds.name] = ds
        return out
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise DatasetError(f"cannot load dataset catalogue {p}: {e}") from None


def get_dataset(name: str, catalogue: dict[str, Dataset] | None = None) -> Dataset:
    cat = catalogue if catalogue is not None else load_catalogue()
    if name not in cat:
        raise DatasetError(f"unknown dataset {name!r} (known: {', '.join(cat)})")
    return cat[name]


def sha256_file(path: str | os.PathLike) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for b in iter(lambda: f.read(1 << 20), b""):
            h.update(b)
    return h.hexdigest()


def tree_sha256(files: dict[str, str]) -> str:
    """SHA-256 of the sorted lines '<relative path> <sha256>\\n' of a set of files."""
    lines = "".join(f"{rel} {files[rel]}\n" for rel in sorted(files))
    return hashlib.sha256(lines.encode()).hexdigest()


def glob_files(base: str, pattern: str) -> dict[str, Path]:
    """relative path -> file for the files under ``base`` matching ``pattern`` (no symlinks;
    ``**`` matches any depth of folders)."""
    root = Path(base)
    return {str(Path(f).relative_to(root)): Path(f) for f in sorted(glob(str(root / pattern), recursive=True))
            if os.path.isfile(f) and not os.path.islink(f)}


# ---- sources: each returns {relative name: file path} to copy, or raises _Skip(reason) ---------
class _Skip(Exception):
    """This source is not usable here; the message says why (and what would fix it)."""


def _check(path: Path, want: str | None) -> None:
    if want and sha256_file(path) != want:
        raise _Skip(f"{path} differs from the catalogue (sha256 mismatch; another package version?)")


def _from_files(source: dict, base: Path | None = None) -> dict[str, Path]:
    out = {}
    for spec in source["files"]:
        p = (base / spec["path"]) if base else Path(spec["path"])
        if not p.is_file():
            pkg = source.get("package")
            raise _Skip(f"install the Debian package {pkg} (apt-get install {pkg})" if pkg
                        else f"{p} is not on this machine")
        _check(p, spec.get("sha256"))
        out[spec.get("name", p.name)] = p
    return out


def _from_glob(source: dict) -> dict[str, Path]:
    files = glob_files(source["base"], source["glob"])
    pkg = source["package"]
    if not files:
        raise _Skip(f"install the Debian package {pkg} (apt-get install {pkg})")
    trees = [(source["count"], source["tree_sha256"])] + [(t["count"], t["tree_sha256"]) for t in source.get("also", [])]
    if len(files) in {n for n, _ in trees}:
        tree = tree_sha256({rel: sha256_file(p) for rel, p in files.items()})
        if (len(files), tree) in trees:
            return files
    counts = " or ".join(str(n) for n in dict.fromkeys(n for n, _ in trees))
    raise _Skip(f"files of {pkg} ({len(files)} found, {counts} expected) differ from the catalogue "
                f"(another package version?)")


def _from_url(source: dict, work: Path, download: bool) -> dict[str, Path]:
    if not download:
        raise _Skip(f"or download it with {named('--download', 'download=True')}")
    import urllib.error
    import urllib.request
    out = {}
    for spec in source["files"]:
        target = work / spec["name"]
        h = hashlib.sha256()
        try:
            with urllib.request.urlopen(spec["url"], timeout=DOWNLOAD_TIMEOUT_S) as r, open(target, "wb") as f:
                for b in iter(lambda: r.read(1 << 20), b""):
                    h.update(b)
                    f.write(b)
        except (urllib.error.URLError, OSError, ValueError) as e:
            raise _Skip(f"download of {spec['url']} failed: {getattr(e, 'reason', None) or e}") from None
        if h.hexdigest() != spec["sha256"]:
            raise _Skip(f"download of {spec['url']} has sha256 {h.hexdigest()[:12]}..., expected "
                        f"{spec['sha256'][:12]}... (refused)")
        out[spec["name"]] = target
    return out


def _from_derived(source: dict, work: Path, download: bool, catalogue: dict[str, Dataset]) -> dict[str, Path]:
    base = get(source["from"], download=download, catalogue=catalogue)
    inp = base / source["input"]
    _check(inp, source.get("content_sha256"))
    if source["recipe"] != "zstd-19":
        raise DatasetError(f"unknown dataset recipe {source['recipe']!r}")
    from .readers.base import need
    zstandard = need("zstandard", "zstandard", "zstd")
    target = work / source["name"]
    with open(inp, "rb") as fi, open(target, "wb") as fo:
        zstandard.ZstdCompressor(level=19, write_checksum=True).copy_stream(fi, fo)
    return {source["name"]: target}


def _resolve(ds: Dataset, source: dict, work: Path, download: bool, catalogue) -> dict[str, Path]:
    kind = source.get("kind")
    if kind == "shipped":
        return _from_files(source, base=datasets_dir())
    if kind in ("debian", "local"):
        return _from_glob(source) if "glob" in source else _from_files(source)
    if kind == "url":
        return _from_url(source, work, download)
    if kind == "derived":
        return _from_derived(source, work, download, catalogue)
    raise DatasetError(f"dataset {ds.name!r}: unknown source kind {kind!r} in the catalogue")


def is_cached(target: Path) -> bool:
    """True when ``target`` holds a complete, intact copy: marker present, and every listed file
    there with its size and its SHA-256 (re-hashed each time: a file of the right size may still
    have been damaged or edited since it was fetched)."""
    try:
        meta = json.loads((target / MARKER).read_text())
        sums = meta["sha256"]
        return bool(meta["files"]) and all(
            (target / rel).is_file() and (target / rel).stat().st_size == size
            and sha256_file(target / rel) == sums[rel] for rel, size in meta["files"].items())
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return False


def _fetched(target: Path) -> set[str]:
    """The files an earlier fetch into target wrote (its marker's list; none without a marker)."""
    try:
        return set(json.loads((target / MARKER).read_text())["files"])
    except (OSError, ValueError, KeyError, TypeError):
        return set()


def get(name: str, dest: str | os.PathLike | None = None, download: bool = False,
        catalogue: dict[str, Dataset] | None = None) -> Path:
    """Fetch a dataset into ``dest`` (default: the cache) and return that directory."""
    cat = catalogue if catalogue is not None else load_catalogue()
    ds = get_dataset(name, cat)
    target = Path(dest) if dest else cache_root() / "datasets" / ds.name
    if is_cached(target):
        return target
    earlier = _fetched(target)   # files an earlier fetch wrote there (replaced if damaged), never others
    reasons = []
    try:
        target.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise DatasetError(f"cannot create {target}: {e.strerror or e}") from None
    with tempfile.TemporaryDirectory(dir=target, prefix=".fetch-") as tmp:
        for source in ds.sources:
            try:
                files = _resolve(ds, source, Path(tmp), download, cat)
            except _Skip as why:
                reasons.append(str(why))
                continue
            theirs = [rel for rel in files if (target / rel).exists() and rel not in earlier]
            if theirs:   # a file of the user's where the dataset would go (data get NAME -d their folder)
                raise DatasetError(f"{target / theirs[0]} exists and is not an earlier copy of {ds.name!r} "
                                   f"(nothing replaced: move it, or give another {named('--dest', 'dest')})")
            sizes, sums = {}, {}
            try:
                for rel, src in files.items():
                    out = target / rel
                    out.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copyfile(src, out)
                    sizes[rel], sums[rel] = out.stat().st_size, sha256_file(out)
                (target / MARKER).write_text(json.dumps({"name": ds.name, "source": source.get("kind"),
                                                         "files": sizes, "sha256": sums}, indent=1))
            except OSError as e:
                raise DatasetError(f"cannot write dataset {ds.name!r} into {target}: {e.strerror or e}") from None
            return target
    raise DatasetError(f"dataset {ds.name!r} is not on this machine: " + "; ".join(dict.fromkeys(reasons)))


def availability(ds: Dataset) -> str:
    """A short word for `data list`: cached, shipped, installed, download, or 'apt-get install X'."""
    if is_cached(cache_root() / "datasets" / ds.name):
        return "cached"
    for s in ds.sources:
        kind = s.get("kind")
        if kind == "shipped":
            return "shipped"
        if kind in ("debian", "local"):
            present = bool(glob_files(s["base"], s["glob"])) if "glob" in s else all(
                Path(f["path"]).is_file() for f in s["files"])
            if present:
                return "installed" if kind == "debian" else "local"
        if kind == "derived":
            return "derived"
    if any(s.get("kind") == "url" for s in ds.sources):
        return "download"
    return "apt-get install " + " ".join(ds.packages) if ds.packages else "unavailable"


def describe_source(source: dict[str, Any]) -> str:
    """One line naming a source, for listings."""
    kind = source.get("kind")
    if kind == "debian":
        return f"debian:{source['package']}"
    if kind == "url":
        return "url"
    if kind == "derived":
        return f"derived from {source['from']} ({source['recipe']})"
    return str(kind)
