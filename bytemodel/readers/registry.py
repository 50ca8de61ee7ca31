"""The reader registry: names -> Reader classes, auto-detection, and the 'name:opts' string form.

Detection of a file (``detect``): the longest extension any reader claims wins (``x.fa.gz`` ->
fasta, ``x.gz`` -> none); else the first reader whose ``sniff`` accepts the first 64 bytes; else
raw. Built-in readers are registered on import; third-party ones come from the entry-point group
``bytemodel.readers`` (each entry point names a Reader subclass), loaded on first use. A plugin
that fails to load is skipped with a warning, so one broken package cannot break every command.

Spec strings (``--reader``): ``NAME`` or ``NAME:opt=value,flag,...``, e.g. ``image:size=64x64,gray``
or ``text:sep=%``. A bare flag means ``flag=yes``.
"""
from __future__ import annotations

import codecs
import os
import warnings
from pathlib import Path
from typing import Any

from ..errors import SourceError
from .base import Reader
from .compressed import compression_of

ENTRY_POINT_GROUP = "bytemodel.readers"
_READERS: dict[str, type[Reader]] = {}
_plugins_loaded = False


def register(cls: type[Reader], name: str | None = None, replace: bool = False) -> type[Reader]:
    """Add a Reader subclass under ``name`` (default ``cls.name``); usable as a class decorator."""
    if not (isinstance(cls, type) and issubclass(cls, Reader)):
        raise TypeError(f"register() needs a Reader subclass, got {cls!r}")
    key = (name or cls.name).strip().lower()
    if not key or ":" in key or "," in key:
        raise ValueError(f"invalid reader name {key!r}")
    if key in _READERS and _READERS[key] is not cls and not replace:
        raise ValueError(f"a reader named {key!r} is already registered ({_READERS[key].__module__}); "
                         f"pass replace=True to override it")
    _READERS[key] = cls
    return cls


def _builtins() -> None:
    from .audio import AudioReader
    from .fasta import FastaReader
    from .image import ImageReader
    from .raw import RawReader
    from .text import TextReader
    from .zstd import ZstdReader
    for cls in (RawReader, TextReader, FastaReader, ZstdReader, ImageReader, AudioReader):
        register(cls, replace=True)


def load_plugins(force: bool = False) -> None:
    """Register the readers advertised under the entry-point group ``bytemodel.readers``."""
    global _plugins_loaded
    if _plugins_loaded and not force:
        return
    _plugins_loaded = True
    from importlib.metadata import entry_points
    try:
        eps = entry_points(group=ENTRY_POINT_GROUP)
    except TypeError:  # Python < 3.10 style API, kept for odd backports
        eps = entry_points().get(ENTRY_POINT_GROUP, [])  # type: ignore[attr-defined]
    for ep in eps:
        try:
            cls = ep.load()
            register(cls, name=ep.name, replace=True)
        except Exception as e:  # a broken plugin must not break the CLI
            warnings.warn(f"bytemodel: reader plugin {ep.name!r} ({ep.value}) not loaded: {e}")


def _all() -> dict[str, type[Reader]]:
    load_plugins()
    return _READERS


def list_readers() -> list[type[Reader]]:
    """Every registered Reader class, built-ins first in registration order, then by name."""
    return list(_all().values())


def parse_spec(spec: str) -> tuple[str, dict[str, str | bool]]:
    """'image:size=64x64,gray' -> ('image', {'size': '64x64', 'gray': True})."""
    name, _, rest = spec.partition(":")
    opts: dict[str, str | bool] = {}
    for item in filter(None, (s.strip() for s in rest.split(","))):
        k, eq, v = item.partition("=")
        opts[k.strip().lower()] = v.strip() if eq else True
    return name.strip().lower(), opts


def get_reader(spec: str | Reader | type[Reader] | None = None, **options: Any) -> Reader:
    """A reader instance from a name or spec string ('image:size=64x64,gray'), a class, or an
    instance (returned as it is). Keyword options are added to those in the string."""
    if isinstance(spec, Reader):
        if options:
            return type(spec)(**{**spec.options, **options})
        return spec
    if isinstance(spec, type) and issubclass(spec, Reader):
        return spec(**options)
    if spec is None:
        spec = "raw"
    name, str_opts = parse_spec(str(spec))
    readers = _all()
    if name not in readers:
        raise SourceError(f"unknown reader {name!r} (known: {', '.join(sorted(readers))})")
    cls = readers[name]
    reader = cls.from_strings(str_opts)
    if options:
        reader = cls(**{**reader.options, **options})
    return reader


def reader_for_extension(name: str) -> type[Reader] | None:
    """The reader class claiming the longest extension that ``name`` ends with, or None."""
    low = name.lower()
    best: tuple[int, type[Reader]] | None = None
    for cls in _all().values():
        for ext in cls.extensions:
            if low.endswith(ext) and (best is None or len(ext) > best[0]):
                best = (len(ext), cls)
    return best[1] if best else None


def detect(path: str | os.PathLike) -> Reader:
    """The reader for one file: by extension, then by magic bytes, else raw (default options)."""
    p = Path(path)
    cls = reader_for_extension(p.name)
    if cls is not None:
        return cls()
    try:
        with open(p, "rb") as f:
            head = f.read(64)
    except FileNotFoundError:
        raise SourceError(f"source not found: {p}") from None
    except OSError as e:
        raise SourceError(f"cannot read {p}: {e.strerror or e}") from None
    found = _sniffed(head)
    if found is None and compression_of(head) is not None:
        found = _inside(p)
    return found or _all()["raw"]()


def _sniffed(head: bytes) -> Reader | None:
    for cls in _all().values():
        if cls.name == "raw":
            continue
        reader = cls()
        if reader.sniff(head):
            return reader
    return None


def _inside(p: Path, n: int = 1 << 16) -> Reader | None:
    """A compressed file that no name claims (gcide.dict.dz, x.dat.gz): the reader its content's first
    n bytes call for (a signature, else UTF-8 text: the text reader decompresses by magic bytes),
    or None (raw: the compressed bytes as they are)."""
    from .compressed import open_decompressed
    try:
        with open_decompressed(p) as f:
            inner = f.read(n)
    except Exception:          # damaged or not what its magic says: the bytes as they are
        return None
    found = _sniffed(inner[:64])
    if found is not None and found.name != "text":
        return found
    try:
        codecs.getincrementaldecoder("utf-8")().decode(inner, final=False)
    except UnicodeDecodeError:
        return None
    printable = sum(1 for b in inner if b >= 32 or b in b"\t\n\r\f")
    return _all()["text"]() if inner and printable >= 0.99 * len(inner) else None


_builtins()
