"""xz and bzip2 files as `xz -d` and `bzip2 -d` read them, strictly: whole streams, nothing after.

Python's LZMAFile and BZ2File stop quietly at the first bytes after a stream that do not start
another stream, so a file with garbage appended (or two files glued badly) would be read short
without a word, while gzip and zstd files with trailing garbage are refused. ``open_strict``
decodes one stream after another and refuses anything else after the last one, except what the
xz format itself allows: zero bytes of stream padding in multiples of four.
"""
from __future__ import annotations

import bz2
import io
import lzma
from typing import BinaryIO

MAGIC = {"xz": b"\xfd7zXZ\x00", "bzip2": b"BZh"}
_READ = 1 << 16   # compressed bytes fed per call: small against the output piece size


class _Streams(io.RawIOBase):
    def __init__(self, raw: BinaryIO, kind: str):
        self._raw, self._kind = raw, kind
        self._dec = self._new()
        self._in = b""          # compressed bytes read but not yet given to a decompressor
        self._done = False

    def _new(self):
        return lzma.LZMADecompressor(lzma.FORMAT_XZ) if self._kind == "xz" else bz2.BZ2Decompressor()

    def readable(self) -> bool:
        return True

    def _more(self, have: bytes, n: int) -> bytes:
        """`have` topped up from the file to at least n bytes, or to the end of the file."""
        while len(have) < n:
            b = self._raw.read(_READ)
            if not b:
                break
            have += b
        return have

    def _next_stream(self) -> None:
        """After a stream's end: start the next one, or finish at the end of the file, or refuse."""
        rest = self._more(self._dec.unused_data + self._in, len(MAGIC[self._kind]))
        self._in = b""
        if self._kind == "xz":
            pad = 0
            while rest[:1] == b"\0":
                stripped = rest.lstrip(b"\0")
                pad += len(rest) - len(stripped)
                rest = self._more(stripped, len(MAGIC["xz"]))
            if pad % 4:
                raise ValueError(f"xz stream padding of {pad} zero bytes is not a multiple of 4")
        if not rest:
            self._done = True
            return
        if not rest.startswith(MAGIC[self._kind]):
            raise ValueError(f"unexpected bytes after the end of the {self._kind} stream (trailing garbage)")
        self._dec, self._in = self._new(), rest

    def readinto(self, buf) -> int:
        while not self._done:
            if self._dec.eof:
                self._next_stream()
                continue
            data = b""
            if self._dec.needs_input:
                data, self._in = self._in or self._raw.read(_READ), b""
                if not data:
                    raise EOFError(f"the {self._kind} stream ends before its end marker")
            out = self._dec.decompress(data, max_length=len(buf))
            if out:
                buf[:len(out)] = out
                return len(out)
        return 0

    def close(self) -> None:
        if not self.closed:
            self._raw.close()
        super().close()


def open_strict(raw: BinaryIO, kind: str) -> BinaryIO:
    """A buffered reader of the decompressed content of an open xz or bzip2 file."""
    return io.BufferedReader(_Streams(raw, kind), 1 << 20)  # type: ignore[return-value]
