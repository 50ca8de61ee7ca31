"""The training run's progress bar (rich, on stderr): step, epoch, loss, bits/byte, bytes/s, ETA."""
from __future__ import annotations


class ProgressBar:
    """A rich progress bar on stderr: step, epoch, loss, bits/byte, bytes/s, ETA. Silent when disabled.
    total None: not known yet (a time budget before its plan)."""

    def __init__(self, enabled: bool, total: int | None, start: int):
        self.enabled = enabled
        if not enabled:
            return
        from rich.console import Console
        from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn,
                                   TimeElapsedColumn, TimeRemainingColumn)
        self.p = Progress(TextColumn("[bold]train"), BarColumn(), MofNCompleteColumn(),
                          TextColumn("{task.fields[info]}"), TimeElapsedColumn(), TextColumn("eta"),
                          TimeRemainingColumn(), console=Console(stderr=True), transient=False)
        self.task = self.p.add_task("train", total=total, completed=start, info="")

    def __enter__(self):
        if self.enabled:
            self.p.__enter__()
        return self

    def __exit__(self, *a):
        if self.enabled:
            self.p.__exit__(*a)

    def set_total(self, total: int):
        if self.enabled:
            self.p.update(self.task, total=total)

    def update(self, step, rec, val, epoch=0.0):
        if self.enabled:
            v = f" val {val:.3f}" if val is not None else ""
            loss = rec["loss"]
            shown = f"{loss:.3f} | {rec['bpb']:.3f} bits/byte" if loss is not None else "skipped"
            info = (f"epoch {epoch:.2f} | loss {shown}{v} | {rec['bytes_per_s'] / 1e3:.1f} kB/s")
            self.p.update(self.task, completed=step, info=info)

    def note(self, text):
        if self.enabled:
            self.p.console.print(text, markup=False, highlight=False)
