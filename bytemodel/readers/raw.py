"""raw: any file, its bytes exactly as they are (executables, archives, unknown formats).

Document: one per file, the file's bytes unchanged. ``read`` allocates the document once (the file
size is known, so no growing buffer and no second copy); ``stream`` holds one piece at a time, so a
file of any size can be fed to a corpus builder in bounded memory. ``write`` stores the generated
bytes unchanged. It claims .bin and .raw, and is the fallback for files no other reader claims.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Iterator

from ..atomic import write_atomic
from ..errors import SourceError
from .base import CHUNK, Reader, identity_join, mark_last, open_binary
from .compressed import pieces


class RawReader(Reader):
    name = "raw"
    extensions = (".bin", ".raw")
    description = "any file, bytes as they are (executables, archives, unknown formats)"

    def read(self, path: str | os.PathLike) -> Iterator[bytes]:
        with open_binary(path) as f:
            try:
                data = f.read()
            except OSError as e:
                raise SourceError(f"cannot read {path}: {e.strerror or e}") from None
        yield data

    def stream(self, path: str | os.PathLike, chunk_size: int = CHUNK) -> Iterator[tuple[bytes, bool]]:
        with open_binary(path) as f:
            yield from mark_last(pieces(f, path, chunk_size))

    def split(self, raw: bytes):
        """The identity: one document, the bytes; an empty layout."""
        return [bytes(raw)], b""

    def join(self, documents, layout: bytes, limit: int | None = None) -> bytes:
        return identity_join(documents, layout, limit)

    def write(self, data: bytes, path: str | os.PathLike) -> Path:
        return write_atomic(path, lambda f: f.write(data), error=SourceError)
