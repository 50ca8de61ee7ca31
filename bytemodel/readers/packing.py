"""The compact byte encoding of a reader's layout (what `split` keeps besides the documents):
unsigned LEB128 integers and length-prefixed byte strings, read back strictly.

    p = Packer(); p.int(60); p.bytes(b">chr1"); blob = p.done()
    u = Unpacker(blob); u.int() -> 60; u.bytes() -> b">chr1"; u.end()

A layout is small and regular (line lengths in runs, a header line per record), so the compressor
codes it with a general-purpose coder (compress/view.py). Reading a malformed layout raises
ValueError (the caller turns it into one error line)."""
from __future__ import annotations


class Packer:
    def __init__(self):
        self._out = bytearray()

    def int(self, v: int) -> None:
        """A non-negative integer, 7 bits a byte, the high bit set on every byte but the last."""
        if v < 0:
            raise ValueError(f"cannot pack a negative integer {v}")
        while v >= 0x80:
            self._out.append((v & 0x7F) | 0x80)
            v >>= 7
        self._out.append(v)

    def bytes(self, b: bytes) -> None:
        self.int(len(b))
        self._out += b

    def done(self) -> bytes:
        return bytes(self._out)


class Unpacker:
    MAX_INT_BYTES = 10           # 70 bits: far past any length a file can hold

    def __init__(self, blob: bytes):
        self._b, self._i = memoryview(bytes(blob)), 0

    def int(self) -> int:
        v = shift = 0
        for _ in range(self.MAX_INT_BYTES):
            if self._i >= len(self._b):
                raise ValueError("layout ends inside an integer")
            c = self._b[self._i]
            self._i += 1
            v |= (c & 0x7F) << shift
            if c < 0x80:
                return v
            shift += 7
        raise ValueError("layout integer too long")

    def bytes(self) -> bytes:
        n = self.int()
        if n > len(self._b) - self._i:
            raise ValueError("layout ends inside a string")
        out = bytes(self._b[self._i:self._i + n])
        self._i += n
        return out

    def at_end(self) -> bool:
        return self._i == len(self._b)

    def end(self) -> None:
        if not self.at_end():
            raise ValueError("layout has trailing bytes")
