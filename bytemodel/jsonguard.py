"""JSON from a user's file, parsed without surprises: bounded nesting, no NaN or Infinity.

Python's json module recurses once per nesting level, so ``[`` * 100000 raises RecursionError
(not a ValueError) from deep inside the parser; and it accepts ``NaN`` and ``Infinity``, which
then reach int() as OverflowError or a model as a non-finite size. ``loads`` measures the nesting
depth first (strings blanked out, one vectorised pass, so a long tok.json costs little) and
refuses more than MAX_DEPTH levels, refuses the non-standard constants, and turns every parse
failure into one ``error`` line. No file bytemodel reads nests deeper than a few levels.
"""
from __future__ import annotations

import json
import numpy as np

from .errors import BytemodelError

MAX_DEPTH = 64          # deepest nesting accepted (ours: at most 5 levels)
_DELTA = np.zeros(256, dtype=np.int8)
_DELTA[[ord("["), ord("{")]] = 1
_DELTA[[ord("]"), ord("}")]] = -1


def depth(raw: bytes) -> int:
    """The deepest nesting of arrays and objects in JSON text, brackets inside strings ignored.

    Linear and vectorised: a quote is escaped when an odd run of backslashes precedes it; a
    character is inside a string when an odd number of unescaped quotes comes before it.
    """
    a = np.frombuffer(bytes(raw), dtype=np.uint8)
    if not len(a):
        return 0
    idx = np.arange(len(a))
    last_plain = np.maximum.accumulate(np.where(a != ord("\\"), idx, -1))   # last non-backslash at or before i
    run_before = np.zeros(len(a), dtype=np.int64)
    run_before[1:] = idx[:-1] - last_plain[:-1]                               # backslashes just before i
    quote = (a == ord('"')) & (run_before % 2 == 0)
    outside = np.cumsum(quote) % 2 == 0                                       # after an even number of quotes
    steps = np.where(outside & ~quote, _DELTA[a], 0).astype(np.int64)
    return int(np.cumsum(steps).max(initial=0))


def _no_constant(name: str):
    raise ValueError(f"{name} is not a JSON number")


def loads(raw: bytes | str, what: str, error: type[BytemodelError] = BytemodelError, *,
          constants: bool = False):
    """Parse ``raw`` (bytes as UTF-8, or text) or raise ``error`` naming ``what``.

    constants: accept NaN / Infinity (only where bytemodel itself may have written them).
    """
    try:
        data = raw.encode("utf-8", "surrogatepass") if isinstance(raw, str) else bytes(raw)
        if depth(data) > MAX_DEPTH:
            raise ValueError(f"nested deeper than {MAX_DEPTH} levels")
        text = data.decode("utf-8")
        if constants:
            return json.loads(text)
        return json.loads(text, parse_constant=_no_constant)
    except (ValueError, UnicodeError, RecursionError) as e:
        msg = str(e).splitlines()[0][:100] if str(e) else type(e).__name__
        raise error(f"{what}: not valid JSON ({msg})") from None
