"""The training progress display on stderr: one line that fits the terminal, or plain lines.

On a terminal: a live line (rich) of the step n/N, the bits/byte of the last step and of the last
validation, the speed and the ETA, which always stay (from MIN_WIDTH columns up); the epoch, the
bar, the elapsed time and the loss in nats are added while the width allows, in that order of
importance (`line`). Narrower than MIN_WIDTH the line is cut at the terminal's edge. Validations and warnings print above it.

Not on a terminal (stderr a file or a pipe): no live line; one plain line per validation, with the
same figures, so a log holds every validation once and nothing cut short.
"""
from __future__ import annotations

import math
import sys
import time

MIN_WIDTH = 60   # the essential fields fit from here up (tests/test_progress.py checks 60..200)


def plus_minus(se) -> str:
    """" ± se" for a validation's standard error, or nothing where there is none (one window held
    out gives NaN; a run that never validated, None)."""
    try:
        return f" ± {se:.4f}" if se is not None and math.isfinite(se) else ""
    except TypeError:
        return ""


def _clock(s: float | None) -> str:
    if s is None or s != s or s < 0 or s == float("inf"):
        return "-:--:--"
    s = int(round(s))
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"


def _speed(bytes_per_s: float | None) -> str:
    if bytes_per_s is None:
        return "- kB/s"
    return f"{bytes_per_s / 1e6:.2f} MB/s" if bytes_per_s >= 1e6 else f"{bytes_per_s / 1e3:.1f} kB/s"


def line(width: int, step: int, total: int | None, bpb: float | None, val: float | None,
         bytes_per_s: float | None, eta: float | None, elapsed: float = 0.0, epoch: float = 0.0,
         loss: float | None = None) -> tuple[str, int, int]:
    """The progress line for a terminal `width` columns wide -> (text, bar_at, bar_width).

    The text holds a gap of bar_width spaces at bar_at where the bar goes (bar_width 0: none).
    Kept always: step n/N, bits/byte (train and last validation), speed, ETA; then, while they
    fit: the epoch, the bar (10 to 40 columns), the elapsed time, the loss in nats."""
    room = width - 1                          # the last column left free: no wrap on any terminal
    n = f"{step}/{total}" if total else f"{step}/?"
    tb = "skipped" if bpb is None else f"{bpb:.3f}"
    v = "" if val is None else f" val {val:.4f}"
    spd, left = _speed(bytes_per_s), _clock(eta if total else None)
    for sep, essential in ((" | ", {"step": f"step {n}", "bpb": f"bits/byte {tb}{v}", "speed": spd,
                                    "eta": f"eta {left}"}),
                           (" ", {"step": n, "bpb": f"bpb {tb}{v}", "speed": spd.replace(" ", ""),
                                  "eta": f"eta {left}"})):      # the compact form, from 57 columns
        if len(sep.join(essential.values())) <= room:
            break
    shown = dict(essential)
    used = len(sep.join(shown.values()))
    for key, text in (("epoch", f"epoch {epoch:.2f}"), ("bar", " " * 10), ("elapsed", _clock(elapsed)),
                      ("loss", None if loss is None else f"loss {loss:.3f}")):   # most important first
        if text and used + len(sep) + len(text) <= room:
            shown[key] = text
            used += len(sep) + len(text)
    if "bar" in shown:                        # the bar takes what is left, up to 40 columns
        shown["bar"] = " " * min(10 + room - used, 40)
    order = [k for k in ("step", "bar", "bpb", "epoch", "loss", "speed", "elapsed", "eta") if k in shown]
    text = sep.join(shown[k] for k in order)
    if "bar" not in shown:
        return text[:room], 0, 0
    return text[:room], len(shown["step"]) + len(sep), len(shown["bar"])


class Progress:
    """The display for one run. enabled False: silent (quiet runs, ranks other than 0).
    total None: not known yet (a time budget before its plan)."""

    def __init__(self, enabled: bool, total: int | None, start: int, stream=None):
        self.enabled, self.total, self.start = enabled, total, start
        self.stream = stream if stream is not None else sys.stderr
        self.live = None
        self.last: dict = {}
        self.t0 = time.perf_counter()
        if not enabled:
            return
        if self.stream is not None and self.stream.isatty():
            from rich.console import Console
            from rich.live import Live
            self.console = Console(file=self.stream)
            self.live = Live(console=self.console, auto_refresh=True, refresh_per_second=4,
                             get_renderable=self._render, transient=False)

    def __enter__(self):
        if self.live is not None:
            self.live.__enter__()
        return self

    def __exit__(self, *a):
        if self.live is not None:
            self.live.__exit__(*a)

    def set_total(self, total: int):
        self.total = total

    def _eta(self, step: int) -> float | None:
        done = step - self.start
        if not self.total or done <= 0:
            return None
        return (time.perf_counter() - self.t0) / done * max(self.total - step, 0)

    def _figures(self) -> dict:
        d = self.last
        return dict(step=d.get("step", self.start), total=self.total, bpb=d.get("bpb"), val=d.get("val"),
                    bytes_per_s=d.get("bytes_per_s"), eta=self._eta(d.get("step", self.start)),
                    elapsed=time.perf_counter() - self.t0, epoch=d.get("epoch", 0.0), loss=d.get("loss"))

    def _render(self):
        from rich.text import Text
        text, at, w = line(self.console.width, **self._figures())
        out = Text(text[:at])
        if w:
            d = self.last.get("step", self.start)
            filled = int(w * min(d / self.total, 1.0)) if self.total else 0
            out.append("━" * filled, style="bar.complete")
            out.append("━" * (w - filled), style="bar.back")
        out.append(text[at + w:])
        return out

    def update(self, step, rec, val, epoch=0.0):
        if self.enabled:
            self.last = dict(step=step, bpb=rec.get("bpb"), loss=rec.get("loss"), val=val,
                             bytes_per_s=rec.get("bytes_per_s"), epoch=epoch)

    def validation(self, step, epoch, bpb, val, se, best, bytes_per_s):
        """One validation's line: above the live line, or (not a terminal) with speed and times."""
        if not self.enabled:
            return
        tb = "skipped" if bpb is None else f"{bpb:.3f}"
        text = (f"step {step}" + (f"/{self.total}" if self.total else "") + f" (epoch {epoch:.2f}): train {tb}, "
                f"val {val:.4f}{plus_minus(se)} bits/byte" + (" (best)" if best else ""))
        if self.live is None:
            self.last = dict(self.last, step=step)
            text += (f" | {_speed(bytes_per_s)} | elapsed {_clock(time.perf_counter() - self.t0)}, "
                     f"eta {_clock(self._eta(step))}")
        self.note(text)

    def note(self, text):
        if not self.enabled:
            return
        if self.live is not None:
            self.console.print(text, markup=False, highlight=False)
        else:
            print(text, file=self.stream, flush=True)
