"""The compressor's view of a file: what the model codes, and the small exact rest.

    v = plan(raw, reader)                 # -> View (kind, the bytes the model codes, the layout blob)
    raw = rebuild(header["view"], reader, coded, blob, limit)

Kinds (the container's view.kind, and the summary line):
- "split": the reader splits the file exactly (Reader.split): the model codes its documents
  joined (what it was trained on: a FASTA file's bases, a pcm16 WAV's samples) and the layout
  (document lengths + the reader's layout: headers, line lengths, case runs) is packed and coded
  by the best of none / zlib -9 / xz -9e (the container names which).
- "as-is": the model codes the file's bytes as they are: the reader's document IS the file (raw,
  plain text), or it has no exact split (mu-law or resampled audio, an image's encoded bytes, a
  compressed file), or its documents hold under half the file; `why` says which.
- "content" (opt in, images only): the model codes the decoded pixels (the image reader's
  document at the file's own size and mode); decompression re-encodes them losslessly in the
  file's own format (PNG, BMP, TIFF, PNM, lossless WebP): the pixels are exact, the bytes are not.
- "packed" (chosen after coding, never planned): the model's coding of the file came out larger
  than the file itself (a model that has not learnt this kind of data), so the model codes
  nothing and the file's bytes go in packed by the best of none / zlib -9 / xz -9e (packed()).
  A .bmz is never larger than its file plus the header.
"""
from __future__ import annotations

import io
import lzma
import zlib
from dataclasses import dataclass

from ..errors import CompressError, named
from ..readers.packing import Packer, Unpacker

KINDS = ("split", "as-is", "content", "packed")
LAYOUT_CODERS = ("none", "zlib", "xz")
MIN_SHARE = 0.5              # a split whose documents hold less of the file than this codes the bytes as-is
CONTENT_FORMATS = {"PNG": {}, "BMP": {}, "TIFF": {}, "PPM": {}, "WEBP": {"lossless": True}}
CONTENT_MODES = ("1", "L", "P", "RGB", "RGBA", "LA", "PA")   # source modes whose pixels the document holds exactly


@dataclass
class View:
    kind: str                # one of KINDS
    reader: str              # the reader's spec ("raw" when there is none)
    data: bytes              # what the model codes
    blob: bytes = b""        # the packed layout, coded by `coder`
    coder: str = "none"
    why: str = ""            # for "as-is": the reason
    documents: int = 1
    format: str = ""         # for "content": the image format it is re-encoded in

    def describe(self) -> str:
        """The summary's words for the view."""
        if self.kind == "split":
            return f"{self.reader} split: {self.documents} document(s) + {len(self.blob):,}-byte layout ({self.coder})"
        if self.kind == "content":
            return f"pixel content ({self.format}, re-encoded losslessly: pixels exact, not the file's bytes)"
        if self.kind == "packed":
            how = "stored as it is" if self.coder == "none" else f"packed by {self.coder}"
            return f"{how}, not coded by the model: {self.why}"
        return f"bytes as they are ({self.why})"


def _spec(reader) -> str:
    return "raw" if reader is None else reader.spec


def _pack(blob: bytes) -> tuple[str, bytes]:
    """The smallest of the blob itself, zlib -9 and xz -9e (ties: the simpler)."""
    tries = [("none", blob), ("zlib", zlib.compress(blob, 9)),
             ("xz", lzma.compress(blob, preset=9 | lzma.PRESET_EXTREME))]
    return min(tries, key=lambda t: len(t[1]))


def _unpack(coder: str, blob: bytes, limit: int, what: str = "layout") -> bytes:
    """Undo _pack, refusing output beyond `limit` bytes (a layout never exceeds its file; packed
    bytes are the file). what: the words of the errors ("the file's layout is corrupt")."""
    try:
        if coder == "none":
            out, done = blob, True
        elif coder == "zlib":
            d = zlib.decompressobj()
            out = d.decompress(blob, limit + 1)
            done = d.eof and not d.unconsumed_tail and not d.unused_data
        elif coder == "xz":
            d = lzma.LZMADecompressor()
            out = d.decompress(blob, limit + 1)
            done = d.eof and not d.unused_data
        else:
            raise CompressError(f"unknown layout coder {coder!r}")
    except (zlib.error, lzma.LZMAError) as e:
        raise CompressError(f"the file's {what} is corrupt ({e})") from None
    if not done or len(out) > limit:
        raise CompressError(f"the file's {what} is corrupt (it does not end where it should)")
    return out


def plan(raw: bytes, reader=None, content: bool = False) -> View:
    """The view of raw under a reader (a Reader instance or None for raw bytes)."""
    raw = bytes(raw)
    if content:
        return _content(raw, reader)
    name = _spec(reader)
    if reader is None or reader.name == "raw":
        return View("as-is", name, raw, why="the raw reader's document is the file")
    got = reader.split(raw)
    if got is None:
        hint = "; --content codes its pixels" if reader.name == "image" else ""
        return View("as-is", name, raw, why=f"the {reader.name} reader has no exact split of this file{hint}")
    docs, layout = got
    if len(docs) == 1 and docs[0] == raw and not layout:
        return View("as-is", name, raw, why=f"the {reader.name} reader's document is the file")
    data = b"".join(docs)
    if len(data) < MIN_SHARE * len(raw):
        return View("as-is", name, raw, why=f"the {reader.name} reader's documents hold only "
                                            f"{100 * len(data) / max(len(raw), 1):.0f}% of the file")
    p = Packer()
    p.int(len(docs))
    for d in docs:
        p.int(len(d))
    p.bytes(layout)
    coder, blob = _pack(p.done())
    return View("split", name, data, blob, coder, documents=len(docs))


def packed(raw: bytes, reader: str, why: str) -> View:
    """The view of a file the model codes no part of: its bytes packed by the best of none / zlib / xz."""
    coder, blob = _pack(raw)
    return View("packed", reader, b"", blob, coder, why=why, documents=0)


def rebuild(view: dict, reader, coded: bytes, blob: bytes, limit: int) -> bytes:
    """The file from the decoded bytes and the layout blob (limit: the original's length)."""
    kind = view["kind"]
    if kind == "packed":
        if coded:
            raise CompressError("malformed .bmz file: a packed file codes no tokens")
        return _unpack(view["coder"], blob, limit, "packed data")
    if kind == "as-is":
        if blob:
            raise CompressError("malformed .bmz file: an as-is view has no layout")
        return coded
    if kind == "content":
        return _encode_content(coded, view["format"])
    packed = _unpack(view["coder"], blob, limit + 16 * 1024)
    try:
        u = Unpacker(packed)
        n = u.int()
        if n > len(coded) + 1:
            raise ValueError("more documents than bytes")
        lengths = [u.int() for _ in range(n)]
        layout = u.bytes()
        u.end()
        if sum(lengths) != len(coded):
            raise ValueError("the documents' lengths do not add up to the decoded bytes")
        docs, at = [], 0
        for k in lengths:
            docs.append(coded[at:at + k])
            at += k
        return reader.join(docs, layout, limit=limit)
    except (ValueError, IndexError, TypeError) as e:
        raise CompressError(f"the file's layout does not rebuild the original ({e})") from None


# ---- images: pixel content ----------------------------------------------------------------------
def _content(raw: bytes, reader) -> View:
    if reader is None or reader.name != "image":
        raise CompressError(f"{named('--content', 'content=True')} codes an image's pixels; the reader here is {_spec(reader)!r}")
    from PIL import Image
    from ..readers.image import ImageReader
    try:
        with Image.open(io.BytesIO(raw)) as im:
            im.load()
            fmt, mode = im.format, im.mode
            if fmt not in CONTENT_FORMATS:
                raise CompressError(f"{named('--content', 'content=True')} re-encodes losslessly in the file's own format; {fmt} has no "
                                    f"lossless encoding here (only {', '.join(CONTENT_FORMATS)})")
            if fmt == "WEBP" and not im.info.get("lossless", True):
                raise CompressError(f"{named('--content', 'content=True')}: this WebP is lossy; only lossless WebP is re-encoded exactly")
            if mode not in CONTENT_MODES:
                raise CompressError(f"{named('--content', 'content=True')}: the image's mode {mode} does not fit 8-bit L/RGB/RGBA pixels exactly")
            doc = ImageReader().to_document(im)      # native size and mode: no resizing, no graying
            rgb = im.convert({"L": "L", "RGB": "RGB", "RGBA": "RGBA"}[doc.split(b" ", 2)[1].decode()])
            exact = rgb.tobytes() == doc[doc.index(b"\n") + 1:]
    except CompressError:
        raise
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as e:
        raise CompressError(f"{named('--content', 'content=True')}: cannot decode the image ({str(e).splitlines()[0] if str(e) else type(e).__name__})") from None
    if not exact:
        raise CompressError(f"{named('--content', 'content=True')}: the image's pixels do not convert to 8-bit L/RGB/RGBA exactly")
    return View("content", "image", doc, format=fmt)


def _encode_content(doc: bytes, fmt: str) -> bytes:
    from PIL import Image
    from ..readers.image import HEADER
    m = HEADER.match(doc)
    if m is None or fmt not in CONTENT_FORMATS:
        raise CompressError("the file's pixel content is malformed")
    mode, w, h = m.group(1).decode(), int(m.group(2)), int(m.group(3))
    pixels = doc[m.end():]
    if len(pixels) != w * h * {"L": 1, "RGB": 3, "RGBA": 4}[mode]:
        raise CompressError("the file's pixel content is malformed")
    out = io.BytesIO()
    Image.frombytes(mode, (w, h), pixels).save(out, format=fmt, **CONTENT_FORMATS[fmt])
    with Image.open(io.BytesIO(out.getvalue())) as back:     # the encoder kept every pixel
        if back.convert(mode).tobytes() != pixels:
            raise CompressError(f"re-encoding the pixels as {fmt} did not keep them exactly")
    return out.getvalue()

