"""audio: WAV/FLAC/OGG/AIFF/AU/MP3 (anything libsndfile decodes, via soundfile) <-> mono PCM bytes.

Document: one per file (or one per ``clip`` seconds): mono samples at ``rate`` Hz, no header:
- ``encoding=mulaw`` (default): 1 byte per sample, G.711 mu-law (8-bit, 14-bit dynamic range;
  the classic choice for byte-level audio models, e.g. WaveNet).
- ``encoding=pcm16``: 2 bytes per sample, signed 16-bit little-endian.
- ``encoding=pcm16msb``: 2 bytes per sample, the high byte first, offset binary (the sample plus
  32768, big-endian: silence is 0x80 0x00, and byte order follows amplitude order): a model
  predicts a sample's coarse value from the samples before it, then its fine value given the
  coarse one, as WaveRNN (Kalchbrenner et al., 2018) splits a 16-bit sample. The same samples as
  pcm16, exactly. Early in training it is no better (benchmarks/README.md, "pcm16msb").

Decoding: the file is read as 16-bit integers, channels are averaged to mono, and the signal is
resampled to ``rate`` (default 8000 Hz, telephone speech) simply: a Hann-windowed sinc low-pass
when lowering the rate, then linear interpolation.

Options: ``rate=N`` (Hz, 1000..192000), ``encoding=mulaw|pcm16|pcm16msb``, ``clip=SECONDS`` (cut
each file into documents of that length; the last one may be shorter), ``invert=yes`` (training
only: each training document is added again with its polarity inverted, every sample negated, as
``fasta:revcomp`` adds the other strand; a waveform's sign is the microphone's wiring, not the
sound, so the model sees twice the speech; -32768 becomes 32767; left unset, a GPU training run on
at most 8 MB of audio turns it on: training/autoconf.auto_invert).

``write`` turns any byte string into a playable mono file at ``rate`` in the container its
extension names (WRITES: .wav, .flac, .aiff, .au, .w64, .caf as 16-bit PCM; .ogg Vorbis, .opus,
.mp3 where libsndfile was built with them; a name without an audio extension gets WAV); a
container this libsndfile cannot write is refused in one line, never replaced by another. With
pcm16 an odd trailing byte is dropped. Mu-law decode then encode gives back the same bytes, so
read -> write -> read is exact for the lossless containers (WAV, FLAC, AIFF, AU, W64, CAF).

``split`` (the compressor's view): with ``encoding=pcm16`` or ``pcm16msb``, a mono 16-bit PCM WAV or
AIFF file at the reader's rate splits exactly into its samples as documents (in the encoding, as
``read`` gives them; an AIFF's big-endian samples are swapped) and a layout of the bytes before and
after them.
Anything else (mu-law, another rate or channel count, other sample formats) is no exact split:
the reader's view drops information there.
"""
from __future__ import annotations

import math
import os
import struct
from pathlib import Path
from typing import Iterator

import numpy as np

from ..atomic import write_atomic
from ..errors import SourceError
from .base import Reader, choice, need, parse_bool
from .packing import Packer, Unpacker

DEFAULT_RATE = 8000  # Hz: speech stays intelligible, 1 s = 8000 bytes of context
MAX_UPSAMPLE = 32    # a file decodes to at most this many samples per sample it holds: memory
                     # stays bounded by the file's real content (8000 -> 192000 Hz needs 24; resampling
                     # holds ~4 float64 arrays of the output, so a 1 MB WAV needs at most ~0.5 GB)

# ---- G.711 mu-law -----------------------------------------------------------------------------
_BIAS, _CLIP = 0x84, 32635
_EXP_LUT = np.array([0, 0] + [1] * 2 + [2] * 4 + [3] * 8 + [4] * 16 + [5] * 32 + [6] * 64 + [7] * 128,
                    dtype=np.int32)  # exponent of (magnitude + bias) >> 7, for 0..255


def mulaw_encode(x: np.ndarray) -> np.ndarray:
    """int16 samples (N,) -> mu-law codes uint8 (N,), the G.711 bit layout (inverted)."""
    x = x.astype(np.int32)
    sign = np.where(x < 0, 0x80, 0)
    mag = np.minimum(np.abs(x), _CLIP) + _BIAS
    exp = _EXP_LUT[(mag >> 7) & 0xFF]
    mant = (mag >> (exp + 3)) & 0x0F
    return (~(sign | (exp << 4) | mant) & 0xFF).astype(np.uint8)


def _decode_table() -> np.ndarray:
    u = ~np.arange(256, dtype=np.int32) & 0xFF
    exp, mant = (u >> 4) & 7, u & 0x0F
    mag = (((mant << 3) + _BIAS) << exp) - _BIAS
    t = np.where(u & 0x80, -mag, mag)
    t[0x7F] = -1  # "negative zero": -1 encodes back to 0x7F, so decode->encode is the identity
    return t.astype(np.int16)


_DECODE = _decode_table()


def mulaw_decode(codes: np.ndarray) -> np.ndarray:
    """mu-law codes uint8 (N,) -> int16 samples (N,)."""
    return _DECODE[codes.astype(np.uint8)]


def inverted(x: np.ndarray) -> np.ndarray:
    """int16 samples (N,) -> the same with the polarity inverted; -32768 has no negation and
    becomes 32767."""
    return np.minimum(-x.astype(np.int32), 32767).astype(np.int16)


# ---- resampling ---------------------------------------------------------------------------------
def resample(x: np.ndarray, src: int, dst: int) -> np.ndarray:
    """float64 samples (N,) at src Hz -> (round(N*dst/src),) at dst Hz; low-pass when lowering."""
    if src == dst or len(x) == 0:
        return x
    if dst < src:
        fc = 0.45 * dst / src                 # cutoff in cycles/sample, a little under Nyquist
        half = min(512, int(np.ceil(4 / fc)))  # ~8 lobes of the sinc each side
        n = np.arange(-half, half + 1)
        h = 2 * fc * np.sinc(2 * fc * n) * np.hanning(2 * half + 1)
        x = np.convolve(x, h / h.sum(), mode="same")
    n_out = int(round(len(x) * dst / src))
    return np.interp(np.arange(n_out) * (src / dst), np.arange(len(x)), x)


# extension -> (libsndfile format, subtype) that write() uses; the lossy ones need libsndfile
# built with them (Vorbis/Opus: libsndfile >= 1.0.29 with libogg; MP3: >= 1.1 with mpg123/lame)
WRITES = {".wav": ("WAV", "PCM_16"), ".wave": ("WAV", "PCM_16"), ".flac": ("FLAC", "PCM_16"),
          ".aif": ("AIFF", "PCM_16"), ".aiff": ("AIFF", "PCM_16"), ".au": ("AU", "PCM_16"),
          ".snd": ("AU", "PCM_16"), ".w64": ("W64", "PCM_16"), ".caf": ("CAF", "PCM_16"),
          ".ogg": ("OGG", "VORBIS"), ".oga": ("OGG", "VORBIS"), ".opus": ("OGG", "OPUS"),
          ".mp3": ("MP3", "MPEG_LAYER_III")}


def _rate(s) -> int:
    v = int(s)
    if not 1000 <= v <= 192000:
        raise ValueError(f"rate must be 1000..192000 Hz, got {v}")
    return v


def _clip(s) -> float:
    v = float(s)
    if not v > 0:
        raise ValueError(f"clip must be a positive number of seconds, got {s}")
    return v


class AudioReader(Reader):
    name = "audio"
    extensions = (".wav", ".wave", ".flac", ".ogg", ".oga", ".opus", ".aif", ".aiff", ".aifc", ".au",
                  ".snd", ".mp3", ".w64", ".caf")
    magic = (b"fLaC", b"OggS", b".snd", b"ID3")
    description = "audio via soundfile: mono 8-bit mu-law (or 16-bit PCM) at 8 kHz; writes WAV"
    OPTIONS = {"rate": _rate, "encoding": choice("mulaw", "pcm16", "pcm16msb"), "clip": _clip, "invert": parse_bool}

    def sniff(self, head: bytes) -> bool:
        return (super().sniff(head) or (head[:4] == b"RIFF" and head[8:12] == b"WAVE")
                or (head[:4] == b"FORM" and head[8:12] in (b"AIFF", b"AIFC")))

    @property
    def rate(self) -> int:
        return self.options.get("rate", DEFAULT_RATE)

    @property
    def encoding(self) -> str:
        return self.options.get("encoding", "mulaw")

    @property
    def augments(self) -> bool:
        return bool(self.options.get("invert"))

    def training_copies(self, doc: bytes) -> list[bytes]:
        """invert: the document with every sample negated (a document the split cut keeps its whole
        samples: an odd trailing byte of pcm16 is dropped)."""
        if not self.augments:
            return []
        return [self.encode(inverted(self.decode(doc)))]

    def decode_samples(self, path: str | os.PathLike) -> np.ndarray:
        """A file -> int16 mono samples (N,) at self.rate."""
        sf = need("soundfile", "soundfile", self.name)
        p = Path(path)
        if not p.is_file():
            raise SourceError(f"source not found: {p}" if not p.exists() else f"not a file: {p}")
        try:
            data, src_rate = sf.read(str(p), dtype="int16", always_2d=True)  # (N, channels)
        except (RuntimeError, TypeError, ValueError, EOFError, OSError) as e:
            msg = str(e).split("\n")[0] or type(e).__name__
            raise SourceError(f"cannot decode audio {p}: {msg}") from None
        if data.shape[0] == 0:
            raise SourceError(f"cannot decode audio {p}: it has no samples")
        if not src_rate > 0 or self.rate > src_rate * MAX_UPSAMPLE:
            # a header that lies (1 Hz) would make each real sample thousands of samples in memory
            raise SourceError(f"cannot decode audio {p}: its header declares a sample rate of {src_rate} Hz, too low to "
                              f"resample to {self.rate} Hz (more than {MAX_UPSAMPLE}x); damaged or not audio")
        mono = data.astype(np.float64).mean(axis=1) if data.shape[1] > 1 else data[:, 0].astype(np.float64)
        mono = resample(mono, int(src_rate), self.rate)
        return np.clip(np.rint(mono), -32768, 32767).astype(np.int16)

    def encode(self, samples: np.ndarray) -> bytes:
        """int16 samples (N,) -> document bytes in this reader's encoding."""
        if self.encoding == "mulaw":
            return mulaw_encode(samples).tobytes()
        if self.encoding == "pcm16msb":
            return (samples.astype(np.int32) + 32768).astype(">u2").tobytes()
        return samples.astype("<i2").tobytes()

    def decode(self, data: bytes) -> np.ndarray:
        """Document bytes -> int16 samples (N,) (pcm16: an odd trailing byte is dropped)."""
        if self.encoding == "mulaw":
            return mulaw_decode(np.frombuffer(bytes(data), dtype=np.uint8))
        data = bytes(data)
        data = data[: len(data) // 2 * 2]
        if self.encoding == "pcm16msb":
            return (np.frombuffer(data, dtype=">u2").astype(np.int32) - 32768).astype(np.int16)
        return np.frombuffer(data, dtype="<i2").astype(np.int16)

    def read(self, path: str | os.PathLike) -> Iterator[bytes]:
        samples = self.decode_samples(path)
        clip = self.options.get("clip")
        step = max(1, int(round(clip * self.rate))) if clip else len(samples)
        for i in range(0, len(samples), step):
            yield self.encode(samples[i:i + step])

    def split(self, raw: bytes):
        """A mono pcm16 WAV/AIFF at this reader's rate -> (sample documents, layout); else None."""
        raw = bytes(raw)
        if self.encoding not in ("pcm16", "pcm16msb"):
            return None
        found = _pcm16_wav(raw) or _pcm16_aiff(raw)
        if found is None:
            return None
        start, end, rate, big = found
        if rate != self.rate:
            return None
        end = start + (end - start) // 2 * 2
        body = raw[start:end]
        body = self.encode(np.frombuffer(body, ">i2" if big else "<i2").astype(np.int16))
        clip = self.options.get("clip")
        step = 2 * (max(1, int(round(clip * self.rate))) if clip else max(len(body) // 2, 1))
        docs = [body[i:i + step] for i in range(0, len(body), step)]
        p = Packer()
        p.int(int(big))
        p.bytes(raw[:start])
        p.bytes(raw[end:])
        return docs, p.done()

    def join(self, documents, layout: bytes, limit: int | None = None) -> bytes:
        u = Unpacker(layout)
        big, head, tail = u.int(), u.bytes(), u.bytes()
        u.end()
        body = b"".join(documents)
        if big > 1 or len(body) % 2:
            raise ValueError("the audio layout does not fit its samples")
        if limit is not None and len(head) + len(body) + len(tail) > limit:
            raise ValueError("the layout describes a file larger than the original")
        body = self.decode(body).astype(">i2" if big else "<i2").tobytes()
        return head + body + tail

    def written_kind(self, path: str | os.PathLike) -> str:
        ext = Path(path).suffix.lower()
        return WRITES[ext][0] if ext in WRITES else ("?" + ext if ext in self.extensions else "WAV")

    def write(self, data: bytes, path: str | os.PathLike) -> Path:
        sf = need("soundfile", "soundfile", self.name)
        ext = Path(path).suffix.lower()
        if ext in self.extensions and ext not in WRITES:
            raise SourceError(f"cannot write {ext} audio (it is read, not written): name the file .wav, .flac, "
                              f"or another of {', '.join(sorted(WRITES))}")
        fmt, subtype = WRITES.get(ext, ("WAV", "PCM_16"))
        if not sf.check_format(fmt, subtype):
            raise SourceError(f"this libsndfile ({sf.__libsndfile_version__}) cannot write {fmt} ({subtype}); "
                              f"write .wav or .flac instead")
        samples = self.decode(data)

        def put(f):
            try:
                sf.write(f, samples, self.rate, format=fmt, subtype=subtype)
            except (RuntimeError, ValueError, TypeError) as e:   # e.g. Opus at a rate it does not take
                raise SourceError(f"cannot write {Path(path).name} as {fmt} {subtype} at {self.rate} Hz: "
                                  f"{str(e).splitlines()[0] if str(e) else type(e).__name__}") from None
        return write_atomic(path, put, error=SourceError)


def _chunks(raw: bytes, order: str) -> Iterator[tuple[bytes, int, int]]:
    """(chunk id, first byte of its body, its declared size) for each chunk after a RIFF or FORM
    header (12 bytes); order: "<" for RIFF (WAV), ">" for IFF (AIFF). Bodies are padded to even."""
    i = 12
    while i + 8 <= len(raw):
        size = struct.unpack(order + "I", raw[i + 4:i + 8])[0]
        yield raw[i:i + 4], i + 8, size
        i += 8 + size + (size & 1)


def _pcm16_wav(raw: bytes):
    """(first sample byte, end, rate, False) of a mono 16-bit PCM WAV's data chunk, else None."""
    if raw[:4] != b"RIFF" or raw[8:12] != b"WAVE":
        return None
    fmt = None
    for cid, body, size in _chunks(raw, "<"):
        if cid == b"fmt " and size >= 16 and body + 16 <= len(raw):
            tag, ch, rate, _, _, bits = struct.unpack("<HHIIHH", raw[body:body + 16])
            if tag == 0xFFFE and size >= 40 and body + 40 <= len(raw):
                tag = struct.unpack("<H", raw[body + 24:body + 26])[0]   # the extensible format's subformat
            fmt = (tag, ch, rate, bits)
        elif cid == b"data":
            if fmt is None or fmt[0] != 1 or fmt[1] != 1 or fmt[3] != 16:
                return None
            return body, min(body + size, len(raw)), fmt[2], False
    return None


def _extended(b: bytes) -> float:
    """An AIFF 80-bit IEEE extended float -> float."""
    exp, mant = struct.unpack(">HQ", b)
    sign = -1.0 if exp & 0x8000 else 1.0
    exp &= 0x7FFF
    if exp - 16383 > 1023:   # infinity, NaN (exp 0x7FFF) or past a double's range: 2.0 ** would raise
        return sign * math.inf
    return 0.0 if exp == 0 and mant == 0 else sign * mant * 2.0 ** (exp - 16383 - 63)


def _pcm16_aiff(raw: bytes):
    """(first sample byte, end, rate, True) of a mono 16-bit AIFF's sound data, else None."""
    if raw[:4] != b"FORM" or raw[8:12] != b"AIFF":
        return None
    comm = None
    for cid, body, size in _chunks(raw, ">"):
        if cid == b"COMM" and size >= 18 and body + 18 <= len(raw):
            ch, frames, bits = struct.unpack(">HIH", raw[body:body + 8])
            rate = _extended(raw[body + 8:body + 18])
            comm = (ch, frames, bits, rate)
        elif cid == b"SSND" and body + 8 <= len(raw):
            if comm is None or comm[0] != 1 or comm[2] != 16 or not math.isfinite(comm[3]) or comm[3] != int(comm[3]):
                return None
            offset = struct.unpack(">I", raw[body:body + 4])[0]
            start = body + 8 + offset
            end = min(start + 2 * comm[1], body + size, len(raw))
            return (start, end, int(comm[3]), True) if start <= end else None
    return None
