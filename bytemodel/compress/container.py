"""The .bmz container: its bytes (magic, version, header, payload, SHA-256 trailer), the strict
reading of its header, and what identifies the model and backend a file needs."""
from __future__ import annotations

import hashlib
import json
import struct
import zlib

from ..errors import CompressError
from .coder import PREC_BITS
from .layout import ENGINES

MAGIC = b"\x89BMZ\r\n\x1a\n"
VERSION = 2                  # 2: the layout names its engine and re-read policy (version 1: the lockstep engine, re-read window/2)
READS = (1, 2)               # container versions this code decodes
FORMAT = "bytemodel-compressed"
_FIXED = len(MAGIC) + 2 + 4  # magic, version, header length
_TRAILER = 32                # SHA-256
MAX_HEADER = 1 << 20


def checkpoint_identity(lm) -> dict:
    """Name and SHA-256 of the weights (as the checkpoint records them) and of the tokenizer."""
    ident = getattr(lm, "_bmz_identity", None)
    if ident is None:
        from ..checkpoint import CKPT_NAME, _sha
        path = lm.path
        name = "" if path is None else (path.parent.name if path.name == CKPT_NAME else path.name)
        tok = json.dumps(lm.tokenizer.to_dict(), sort_keys=True, separators=(",", ":")).encode()
        ident = {"name": name, "weights_sha256": _sha(lm.model.ops.to_numpy(lm.model.params)),
                 "tokenizer_sha256": hashlib.sha256(tok).hexdigest()}
        lm._bmz_identity = ident
    return ident


def backend_info(model) -> dict:
    """The device, precision and numerical libraries that computed the probabilities."""
    return model.ops.describe()


def _pack(header: dict, payload: bytes) -> bytes:
    h = zlib.compress(json.dumps(header, sort_keys=True, separators=(",", ":")).encode("utf-8"), 9)
    body = MAGIC + struct.pack("<HI", VERSION, len(h)) + h + payload
    return body + hashlib.sha256(body).digest()


def read(blob: bytes) -> tuple[dict, bytes]:
    """A container -> (header, payload), refusing foreign, cut, corrupt or malformed files."""
    blob = bytes(blob)
    if not blob.startswith(MAGIC):
        raise CompressError("not a bytemodel compressed file (.bmz): wrong magic bytes")
    if len(blob) < _FIXED + _TRAILER:
        raise CompressError("truncated .bmz file")
    if hashlib.sha256(blob[:-_TRAILER]).digest() != blob[-_TRAILER:]:
        raise CompressError("corrupt or truncated .bmz file (its SHA-256 does not match)")
    version, hlen = struct.unpack("<HI", blob[len(MAGIC):_FIXED])
    if version not in READS:
        raise CompressError(f".bmz container version {version}; this bytemodel reads versions "
                            f"{', '.join(map(str, READS))}")
    if hlen > MAX_HEADER or _FIXED + hlen > len(blob) - _TRAILER:
        raise CompressError("malformed .bmz file: bad header length")
    try:
        text = zlib.decompressobj().decompress(blob[_FIXED:_FIXED + hlen], MAX_HEADER)
        header = json.loads(text.decode("utf-8"))
        if version == 1 and isinstance(header, dict) and isinstance(header.get("layout"), dict):
            header["layout"].setdefault("engine", "lockstep")    # version 1: always the lockstep engine
        _validate(header, version)
    except (ValueError, KeyError, TypeError, UnicodeDecodeError, zlib.error) as e:
        raise CompressError(f"malformed .bmz header ({e})") from None
    payload = blob[_FIXED + hlen:-_TRAILER]
    if len(payload) != header["payload_bytes"]:
        raise CompressError("malformed .bmz file: the payload's length does not match its header")
    return header, payload


def _int(d, k, lo=0):
    v = d[k]
    if isinstance(v, bool) or not isinstance(v, int) or v < lo:
        raise ValueError(f"{k} must be an integer >= {lo}, got {v!r}")
    return v


def _validate(h: dict, version: int = VERSION) -> None:
    if h.get("format") != FORMAT or h.get("version") != version:
        raise ValueError("not a bytemodel compressed file of this version")
    for k in ("weights_sha256", "tokenizer_sha256", "name"):
        if not isinstance(h["checkpoint"][k], str):
            raise ValueError(f"checkpoint {k} missing")
    if h["reader"] != "raw":
        raise ValueError(f"reader {h['reader']!r} is not supported by this version (only raw)")
    _int(h["original"], "bytes")
    if not isinstance(h["original"]["sha256"], str):
        raise ValueError("original sha256 missing")
    lay = h["layout"]
    n, S, W, ln = _int(lay, "tokens"), _int(lay, "streams"), _int(lay, "window", 2), _int(lay, "lane", 1)
    if (n > 0) != (S > 0) or S > n or W % 2:
        raise ValueError("inconsistent stream layout")
    engine, rr = lay["engine"], _int(lay, "reread")
    if engine not in ENGINES or (engine == "lockstep" and rr not in (0, W // 2)) or (engine == "cpu" and rr >= W):
        raise ValueError(f"unknown engine or re-read policy ({engine!r}, re-read {rr} of window {W})")
    c = h["coder"]
    if c.get("precision_bits") != PREC_BITS or c.get("model") != "Categorical(perfect=False)":
        raise ValueError("unknown coder settings")
    _int(c, "alphabet", 1)
    gw = c["group_words"]
    if not isinstance(gw, list) or (n > 0) != (len(gw) > 0) or len(gw) > max(S, 1) \
            or any(isinstance(w, bool) or not isinstance(w, int) or w < 0 for w in gw) \
            or 4 * sum(gw) != h["payload_bytes"]:
        raise ValueError("inconsistent coder groups")
    if not isinstance(h["backend"].get("device"), str):
        raise ValueError("backend missing")
    if _int(h, "payload_bytes") % 4:
        raise ValueError("payload is not whole 32-bit words")


def check_model(header: dict, lm) -> None:
    """Refuse a model other than the one the file was compressed with, or another backend."""
    want, have = header["checkpoint"], checkpoint_identity(lm)
    if want["weights_sha256"] != have["weights_sha256"] or want["tokenizer_sha256"] != have["tokenizer_sha256"]:
        raise CompressError(f"this file was compressed with checkpoint '{want['name']}' (weights "
                            f"{want['weights_sha256'][:12]}), not with '{have['name']}' (weights "
                            f"{have['weights_sha256'][:12]}): pass --checkpoint for '{want['name']}'")
    if header["coder"]["alphabet"] != lm.tokenizer.doc_id:
        raise CompressError("the file's alphabet does not match the model's tokenizer")
    b, here = header["backend"], backend_info(lm.model)
    if (b["device"], b.get("precision")) != (here["device"], here["precision"]):
        raise CompressError(f"this file was compressed on {b['device']} ({b.get('precision')}); the model here "
                            f"computes on {here['device']} ({here['precision']}) whose probabilities differ: "
                            f"decompress with --device {b['device']}")
