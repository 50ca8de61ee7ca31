"""The coder overlapped with the device: steps queued on a device stepper while the host codes.

    run(steppers, bounds, lengths, decide, doc_id, known=None, progress=None)

A stepper (ops/cuda_decode.LockstepGraph on a GPU; any object with these two methods) takes a
lane's tokens and answers with that step's frequency table later:
    stepper.enqueue(ids)   # (lane,) ints: queue one step (copied at once; at most two in flight)
    stepper.result()       # (lane, A) float32 host array of the oldest step in flight (waits)
A result is a view of a buffer the stepper overwrites two steps later, so it is used before the
step after next is queued.

Decompression cannot run ahead (step t + 1 is fed the tokens step t decodes): each step is queued,
waited for and decoded in turn. Compression knows every token up front (`known(t, active)`: the
tokens decide(t, ...) will return), so step t + 1 is queued before step t's symbols are coded,
and the device computes while the host's range coders run. The steps, their tokens and the order
in which decide sees them are _drive's (compress/driver.py), so the payload is the same bytes;
decide's tokens are checked against `known`, and a mismatch is an error rather than a file that
does not decode.
"""
from __future__ import annotations

import numpy as np


def run(steppers, bounds, lengths: np.ndarray, decide, doc_id: int, known=None, progress=None) -> None:
    """Every step of the streams `lengths` (S,) through the steppers (one per lane, lane i holding
    streams bounds[i] = (a, b)); decide(t, active, freqs (active, A), None) -> tokens (active,),
    as in driver._drive. Inactive streams are fed token 0."""
    S = len(lengths)
    steps = int(lengths[0]) if S else 0
    feed = np.full(S, doc_id, dtype=np.int64)

    def queue(feed):
        for st, (a, b) in zip(steppers, bounds):
            st.enqueue(feed[a:b])

    def take():
        parts = [st.result() for st in steppers]
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    if steps:
        queue(feed)
    for t in range(steps):
        active = int(np.count_nonzero(lengths > t))
        if known is not None and t + 1 < steps:        # queue the next step before coding this one
            nxt = np.asarray(known(t, active))
            feed[:active] = nxt
            feed[active:] = 0
            queue(feed)
        freqs = take()
        got = decide(t, active, freqs[:active], None)
        if known is not None:
            if t + 1 < steps and not np.array_equal(np.asarray(got), nxt):
                raise RuntimeError(f"step {t}: the coded tokens are not the ones queued ahead")
        else:
            feed[:active] = got
            feed[active:] = 0
            if t + 1 < steps:
                queue(feed)
        if progress is not None:
            progress(active)
