"""What the training loop watches between steps: the best validation, patience, over-fitting, overflow.

`Watch` is plain bookkeeping with no arrays and no I/O: the loop tells it each step's loss and each
validation, and it answers what to do (save a new best, stop early, warn, stop with an error). Its
state goes into the resume checkpoint, so a resumed run keeps counting where it stopped.

- Best: the lowest finite validation so far, and its step.
- Patience: `patience` validations in a row without a new best end the run (0: never).
- Over-fitting: the first validation that rises above the best while the mean training loss since
  the previous validation fell gives one warning, naming the epoch (passes over the training data).
- Overflow (fp16): a non-finite loss for OVERFLOW_STEPS steps in a row while the loss scale is at
  its floor cannot be fixed by the scaler: the run stops with an error suggesting bf16.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

from ..errors import BytemodelError, named

OVERFLOW_STEPS = 8   # non-finite steps in a row at the lowest loss scale before giving up


class OverflowError16(BytemodelError):
    """fp16 training hit an overflow the loss scaler cannot recover from."""


@dataclass
class Watch:
    patience: int = 0
    best_val: float | None = None
    best_step: int = 0
    best_se: float | None = None         # standard error of the best validation figure
    since_best: int = 0                  # validations since the best one
    warned_overfit: bool = False
    nonfinite_run: int = 0               # non-finite steps in a row
    nonfinite_total: int = 0
    floor_run: int = 0                   # non-finite steps in a row at the lowest loss scale
    prev_val: float | None = None
    prev_train: float | None = None      # mean training loss over the previous interval
    _train_sum: float = field(default=0.0, repr=False)
    _train_n: int = field(default=0, repr=False)

    # ----- per step
    def step(self, step: int, loss: float, finite: bool, scale: float, scale_floor: float,
             fp16: bool) -> str | None:
        """Record a step's outcome; returns a warning line to print (or None); raises on overflow."""
        if finite:
            self.nonfinite_run = self.floor_run = 0
            self._train_sum += loss
            self._train_n += 1
            return None
        self.nonfinite_run += 1
        self.nonfinite_total += 1
        if fp16 and scale <= scale_floor:
            self.floor_run += 1
            if self.floor_run >= OVERFLOW_STEPS:
                raise OverflowError16(
                    f"fp16 overflow at step {step}: the loss stayed non-finite for {self.floor_run} steps "
                    f"at the lowest loss scale; the activations no longer fit in fp16 "
                    "(train with " + named('--precision bf16', 'precision="bf16"') + f", or a lower {named('--lr', 'lr')})" + self.best_note())
        else:
            self.floor_run = 0
        if self.nonfinite_total == 1:
            what = f"skipped (loss scale now {scale:g})" if fp16 else "skipped"
            return f"warning: step {step}: non-finite loss or gradient; step {what}"
        return None

    def best_note(self) -> str:
        if self.best_val is None:
            return "; no validation was reached, so there is no best checkpoint"
        return f"; the best checkpoint (step {self.best_step}, {self.best_val:.4f} bits/byte) is intact"

    # ----- per validation
    def validation(self, step: int, val: float, epoch: float, se: float | None = None) -> tuple[bool, list[str]]:
        """Record a validation; -> (is a new best, lines to print)."""
        notes = []
        train = self._train_sum / self._train_n if self._train_n else None
        self._train_sum, self._train_n = 0.0, 0
        if not math.isfinite(val):
            notes.append(f"warning: validation at step {step} is not finite; not kept as best, "
                         f"recorded as null in the metrics")
            self.since_best += 1
            return False, notes
        new_best = self.best_val is None or val < self.best_val
        if (not new_best and not self.warned_overfit and self.prev_val is not None and val > self.prev_val
                and train is not None and self.prev_train is not None and train < self.prev_train):
            self.warned_overfit = True
            notes.append(f"warning: epoch {epoch:.1f}: validation rose to {val:.4f} bits/byte (best "
                         f"{self.best_val:.4f} at step {self.best_step}) while training fell: the model is "
                         f"starting to memorise the training data; the best checkpoint is kept")
        if new_best:
            self.best_val, self.best_step, self.since_best = val, step, 0
            self.best_se = se if se is not None and math.isfinite(se) else None
        else:
            self.since_best += 1
        self.prev_val = val
        if train is not None:
            self.prev_train = train
        return new_best, notes

    def out_of_patience(self) -> bool:
        return self.patience > 0 and self.since_best >= self.patience

    # ----- checkpoint state
    def state(self) -> dict:
        d = asdict(self)
        d.pop("_train_sum"), d.pop("_train_n")
        return d

    @classmethod
    def from_state(cls, d: dict | None, patience: int) -> "Watch":
        """From a checkpoint's state, checked (a checkpoint is a file anyone can craft)."""
        from ..errors import CheckpointError
        w = cls(patience=patience)
        if d is not None and not isinstance(d, dict):
            raise CheckpointError("the training state's watch is not a JSON object")
        for k, v in (d or {}).items():
            if k == "patience" or k.startswith("_") or not hasattr(w, k):
                continue
            now = getattr(w, k)
            ok = (isinstance(v, bool) if isinstance(now, bool) else
                  v is None or (isinstance(v, (int, float)) and not isinstance(v, bool)))
            if not ok or (isinstance(now, int) and not isinstance(now, bool) and now is not None
                          and not isinstance(v, int)):
                raise CheckpointError(f"the training state's watch.{k} is not valid ({v!r})")
            setattr(w, k, v)
        return w
