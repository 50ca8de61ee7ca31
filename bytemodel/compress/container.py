"""The .bmz container: its bytes (magic, version, header, payload, SHA-256 trailer), the strict
reading of its header, and what identifies the model and backend a file needs."""
from __future__ import annotations

import hashlib
import json
import math
import os
import struct
import zlib
from pathlib import Path

from ..decode.window import keep
from ..errors import CompressError, named
from ..jsonguard import loads as json_loads
from .coder import PREC_BITS
from .layout import ENGINES
from .view import KINDS, LAYOUT_CODERS
from .zdict import HEADER_ZDICT

MAGIC = b"\x89BMZ\r\n\x1a\n"
VERSION = 5                  # 5: the view "packed" (the model's coding came out larger than the file: the
                             #    bytes packed by the best of none / zlib / xz instead);
                             # 4: the header deflated against zdict.HEADER_ZDICT (~500 bytes less a file);
                             # 3: the view (the reader's split: documents + a layout after the coder's words);
                             # 2: the layout names its engine and re-read policy (1: the lockstep engine, re-read window/2)
READS = (1, 2, 3, 4, 5)      # container versions this code decodes
PACKED_FROM = 5              # the first version that may hold a packed view
ZDICT_FROM = 4               # the first version whose header is deflated against HEADER_ZDICT
FORMAT = "bytemodel-compressed"
_FIXED = len(MAGIC) + 2 + 4  # magic, version, header length
_TRAILER = 32                # SHA-256
MAX_HEADER = 1 << 20
MAX_STREAMS = 1 << 16        # streams a file may have (each costs its bookkeeping before a word is decoded)
MAX_LANE = 1 << 13           # streams in one batched KV cache (the GPU's default at most; the CPU's 256)
MIN_ALPHABET = 256           # the bytes: every tokenizer has them
SLACK_BITS = 128             # per coder: a range coder's flush may end up to this far short of the information


def run_identity(path) -> dict:
    """What names a checkpoint file among the user's runs: the run folder's name and the file's."""
    from ..checkpoint import BEST_NAME, CKPT_NAME
    if path is None:
        return {"name": "", "file": ""}
    path = Path(path)
    if path.name in (CKPT_NAME, BEST_NAME):
        return {"name": path.resolve().parent.name, "file": path.name}
    return {"name": path.name, "file": path.name}


def checkpoint_identity(lm) -> dict:
    """The run's name, the weights file's name, and the SHA-256 of the weights and of the tokenizer."""
    ident = getattr(lm, "_bmz_identity", None)
    if ident is None:
        from ..checkpoint import _sha
        tok = json.dumps(lm.tokenizer.to_dict(), sort_keys=True, separators=(",", ":")).encode()
        ident = {**run_identity(lm.path), "weights_sha256": _sha(lm.model.ops.to_numpy(lm.model.params)),
                 "tokenizer_sha256": hashlib.sha256(tok).hexdigest()}
        lm._bmz_identity = ident
    return ident


def _safe_name(name) -> bool:
    """A plain folder or file name (never a path: nothing taken from a file is followed as one)."""
    return isinstance(name, str) and 0 < len(name) < 256 and name not in (".", "..") \
        and not any(c in name for c in "/\\\0")


def find_run(header: dict, root="runs") -> Path:
    """The checkpoint under ``root`` whose weights and tokenizer a file was compressed with.

    The header's run name is only a hint of where to look first (runs/NAME, then ./NAME for a run
    trained with `--out NAME`, when NAME is a plain name); the match is by the weights' and
    tokenizer's SHA-256, over those and every run's best.safetensors and checkpoint.safetensors
    under ``root`` (newest first). A path in the file is never followed. CompressError when no
    run matches.
    """
    from .. import checkpoint as ck
    want = header["checkpoint"]
    root = Path(root)
    first, files = [], []
    names = (want.get("file"),) if _safe_name(want.get("file")) else ()
    order = names + tuple(n for n in (ck.BEST_NAME, ck.CKPT_NAME) if n not in names)
    if _safe_name(want.get("name")):
        first = [d / want["name"] / n for d in (root, Path(".")) for n in order]
    try:
        runs = sorted((d for d in root.iterdir() if d.is_dir()), key=lambda d: -d.stat().st_mtime)
    except OSError:
        runs = []
    files = [d / n for d in runs for n in (ck.BEST_NAME, ck.CKPT_NAME)]
    seen = set()
    for f in first + files:
        key = os.path.abspath(f)
        if key in seen or not f.is_file():
            continue
        seen.add(key)
        try:
            ld = ck.load(f)
        except ck.CheckpointError:
            continue
        tok = json.dumps(ld.tokenizer.to_dict(), sort_keys=True, separators=(",", ":")).encode()
        if ck._sha(ld.params) == want["weights_sha256"] and hashlib.sha256(tok).hexdigest() == want["tokenizer_sha256"]:
            return f
    shown = want["name"] if _safe_name(want.get("name")) else "?"
    raise CompressError(f"no run under {root}/ holds the weights this file was compressed with (run "
                        f"'{shown}', weights {str(want['weights_sha256'])[:12]}): pass --checkpoint")


def backend_info(model) -> dict:
    """The device, precision and numerical libraries that computed the probabilities."""
    return model.ops.describe()


def _pack(header: dict, payload: bytes) -> bytes:
    text = json.dumps(header, sort_keys=True, separators=(",", ":")).encode("utf-8")
    z = zlib.compressobj(9, zlib.DEFLATED, 15, 9, zlib.Z_DEFAULT_STRATEGY, HEADER_ZDICT)
    h = z.compress(text) + z.flush()
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
        z = zlib.decompressobj(zdict=HEADER_ZDICT) if version >= ZDICT_FROM else zlib.decompressobj()
        text = z.decompress(blob[_FIXED:_FIXED + hlen], MAX_HEADER)
        header = json_loads(text, ".bmz header", CompressError)
        if not isinstance(header, dict):
            raise ValueError("the header is not a JSON object")
        if version == 1 and isinstance(header, dict) and isinstance(header.get("layout"), dict):
            header["layout"].setdefault("engine", "lockstep")    # version 1: always the lockstep engine
        if version < 3 and isinstance(header, dict) and isinstance(header.get("original"), dict):
            header["view"] = {"kind": "as-is", "coder": "none", "layout_bytes": 0, "why": "", "format": "",
                              "coded": header["original"]}         # before version 3: the bytes as they are
        v = header.get("view") if isinstance(header, dict) else None
        if isinstance(v, dict) and v.get("kind") not in ("split", "packed"):
            v["coded"] = header.get("original")    # as-is and content: what the model coded IS the original
        _validate(header, version)
    except (ValueError, KeyError, TypeError, AttributeError, UnicodeDecodeError, zlib.error) as e:
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


def _dict(h, k) -> dict:
    v = h[k]
    if not isinstance(v, dict):
        raise ValueError(f"{k} must be a JSON object")
    return v


def max_tokens(payload_bytes: int, alphabet: int, coders: int) -> int:
    """The most tokens a payload can code: each costs at least -log2 of the largest frequency the
    quantiser gives (every other symbol keeps at least 1 of 2^PREC_BITS), plus each coder's slack."""
    best = ((1 << PREC_BITS) - (alphabet - 1)) / (1 << PREC_BITS)
    per_token = -math.log2(best)
    return int((8 * payload_bytes + SLACK_BITS * max(coders, 1)) / per_token) + 1


def information_limit(header: dict) -> float:
    """Bits of information the payload can hold: a decoder that has produced more reads a lie."""
    return 8.0 * header["payload_bytes"] + SLACK_BITS * max(len(header["coder"]["group_words"]), 1)


def check_layout(streams: int, lane: int) -> None:
    """The bounds every file keeps (compress refuses to write past them, read to believe them)."""
    if streams > MAX_STREAMS:
        raise CompressError(f"{streams} streams; at most {MAX_STREAMS} in one file")
    if lane > MAX_LANE:
        raise CompressError(f"a lane of {lane} streams; at most {MAX_LANE}")


def _validate(h: dict, version: int = VERSION) -> None:
    if h.get("format") != FORMAT or h.get("version") != version:
        raise ValueError("not a bytemodel compressed file of this version")
    ck = _dict(h, "checkpoint")
    for k in ("weights_sha256", "tokenizer_sha256", "name"):
        if not isinstance(ck[k], str):
            raise ValueError(f"checkpoint {k} missing")
    if "file" in ck and not isinstance(ck["file"], str):
        raise ValueError("checkpoint file is not a string")
    if not isinstance(h["reader"], str) or (version < 3 and h["reader"] != "raw"):
        raise ValueError(f"reader {h['reader']!r} is not supported by this version (only raw)")
    orig, lay, c, backend = _dict(h, "original"), _dict(h, "layout"), _dict(h, "coder"), _dict(h, "backend")
    v = _dict(h, "view")
    if v["kind"] not in KINDS or v["coder"] not in LAYOUT_CODERS or not isinstance(v["why"], str) \
            or not isinstance(v["format"], str) or not isinstance(_dict(v, "coded")["sha256"], str) \
            or (v["kind"] == "packed" and version < PACKED_FROM):
        raise ValueError("unknown view")
    lb = _int(v, "layout_bytes")
    _int(v["coded"], "bytes")
    if (v["kind"] not in ("split", "packed")) != (lb == 0 and v["coder"] == "none"):
        raise ValueError("inconsistent view")
    if v["kind"] == "packed" and (v["coded"]["bytes"] != 0 or _int(_dict(h, "layout"), "tokens") != 0):
        raise ValueError("inconsistent view: a packed file codes no tokens")
    _int(orig, "bytes")
    if not isinstance(orig["sha256"], str):
        raise ValueError("original sha256 missing")
    n, S, W, ln = _int(lay, "tokens"), _int(lay, "streams"), _int(lay, "window", 2), _int(lay, "lane", 1)
    if (n > 0) != (S > 0) or S > n or W % 2:
        raise ValueError("inconsistent stream layout")
    if S > MAX_STREAMS or ln > MAX_LANE:
        raise ValueError(f"{S} streams in lanes of {ln}; a file holds at most {MAX_STREAMS} streams, "
                         f"lanes of at most {MAX_LANE}")
    engine, rr = lay["engine"], _int(lay, "reread")
    if engine not in ENGINES or (engine == "lockstep" and rr not in (0, keep(W))) or (engine == "cpu" and rr >= W):
        raise ValueError(f"unknown engine or re-read policy ({engine!r}, re-read {rr} of window {W})")
    if c.get("precision_bits") != PREC_BITS or c.get("model") != "Categorical(perfect=False)":
        raise ValueError("unknown coder settings")
    A = _int(c, "alphabet", MIN_ALPHABET)
    if A >= 1 << PREC_BITS:
        raise ValueError(f"alphabet {A} does not fit the coder's precision")
    gw = c["group_words"]
    if not isinstance(gw, list) or (n > 0) != (len(gw) > 0) or len(gw) > max(S, 1) \
            or any(isinstance(w, bool) or not isinstance(w, int) or w < 0 for w in gw) \
            or 4 * sum(gw) + lb != h["payload_bytes"]:
        raise ValueError("inconsistent coder groups")
    if h.get("adapt") is not None:
        from .adapt import Adapt
        Adapt.from_header(h["adapt"])
    if not isinstance(backend.get("device"), str):
        raise ValueError("backend missing")
    P = _int(h, "payload_bytes") - lb                 # the coders' words (the layout blob follows them)
    if P < 0 or P % 4:
        raise ValueError("payload is not whole 32-bit words")
    if n > max_tokens(P, A, len(gw)):
        raise ValueError(f"{n:,} tokens cannot be coded in {P:,} bytes of payload")
    if v["coded"]["bytes"] < n:
        raise ValueError(f"{n:,} tokens cannot decode to {v['coded']['bytes']:,} bytes")


def check_model(header: dict, lm) -> None:
    """Refuse a model other than the one the file was compressed with, or another backend."""
    want, have = header["checkpoint"], checkpoint_identity(lm)
    if want["weights_sha256"] != have["weights_sha256"] or want["tokenizer_sha256"] != have["tokenizer_sha256"]:
        raise CompressError(f"this file was compressed with checkpoint '{want['name']}' (weights "
                            f"{want['weights_sha256'][:12]}), not with '{have['name']}' (weights "
                            f"{have['weights_sha256'][:12]}): {named('pass --checkpoint for', 'load the checkpoint of')} '{want['name']}'")
    if header["coder"]["alphabet"] != lm.tokenizer.doc_id:
        raise CompressError("the file's alphabet does not match the model's tokenizer")
    b, here = header["backend"], backend_info(lm.model)
    if (b["device"], b.get("precision")) != (here["device"], here["precision"]):
        raise CompressError(f"this file was compressed on {b['device']} ({b.get('precision')}); the model here "
                            f"computes on {here['device']} ({here['precision']}) whose probabilities differ: "
                            f"decompress with {named('--device ', 'a model loaded with device=')}{b['device']}")
