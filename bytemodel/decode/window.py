"""The window rule: what a model reads when its context is full, written once.

A model is trained on windows of T = cfg.context tokens, positions 0..T-1. Decoding past T
re-reads the newest keep(T) = T/2 tokens into a fresh cache from position 0 and goes on, so the
model always sees windows like those it was trained on (generate, speculative, lockstep, the
compressor's re-read policy, scoring in half-overlapping windows). The compressor's other policy,
sliding (a ring cache, Model.block), needs no re-read at all.
"""
from __future__ import annotations


def keep(T: int) -> int:
    """Tokens a full window of T keeps when it is re-read (and the overlap of scoring windows)."""
    return T // 2


def start(history: list, T: int) -> list:
    """The ids a (re)start reads: the whole history if it fits the window, else the newest T/2."""
    return history[-(keep(T) if len(history) > T else T):]


def reread(history: list, T: int) -> list:
    """The ids a full window is re-read from: the newest T/2 of `history`."""
    return history[-keep(T):]
