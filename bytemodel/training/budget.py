"""A time budget (`--minutes M`): plan the run's step count from its measured speed.

The learning-rate schedule (linear warmup, then cosine) needs the total step count, which a time
budget does not give. So the run first trains through its warmup (whose learning rate does not
depend on the total), timing the steps of the warmup's second half (the first steps include
kernel compilation and cache warm-up); at the plan step it validates and saves once, timing that
too, and then fixes

    total = step + (budget left) / (seconds per step + seconds per validation-and-save / eval_every)

The total is the loop's own state (LoopState.planned, training/loop.py), not a setting, and goes
into every checkpoint: a resumed run continues to the same total on the same schedule. Until the plan is made the cosine
has not started (the learning rate is the warmup's, then the peak), so nothing depends on it yet.
If the run is slower than planned (a busy machine), it stops at OVERRUN x the budget all the same.

A run whose steps get dearer after the plan (`--dropout auto` turns dropout on there: on the
H200 at base 51.6 ms a step was measured without it, ~60 with it, and the first English run so
planned used its budget up at step 5,962 of 6,209, before its schedule's end) plans once more
at its first validation at least REPLAN_STEPS steps later, from the steps since the plan
(training/loop.py, Loop._replan). The total then moves by a few percent while the cosine has
hardly begun. A run killed between the two plans and resumed keeps the first (its steps are
timed again only at a plan), and stops at OVERRUN x the budget if that was short.
"""
from __future__ import annotations

import math
import time

MIN_PLAN_STEP = 10   # plan no earlier than this, so that at least 5 steps are timed
OVERRUN = 1.1        # stop anyway once this multiple of the budget has passed
REPLAN_STEPS = 20    # a second plan times at least this many steps after the first


class Budget:
    def __init__(self, minutes: float, elapsed: float = 0.0, planned: bool = False):
        self.seconds = minutes * 60.0
        self.enabled = minutes > 0
        self.before = elapsed           # seconds trained by earlier processes of this run
        self.planned = planned
        self.t0 = time.perf_counter()
        self._marks: dict[int, float] = {}   # step -> training seconds when it finished
        self._paused = 0.0                   # seconds spent validating/saving (not training)

    def elapsed(self) -> float:
        return self.before + time.perf_counter() - self.t0

    def plan_step(self, warmup: int, start: int) -> int:
        """The step at which the total is planned (a validation boundary is forced there)."""
        return max(warmup, MIN_PLAN_STEP, start + MIN_PLAN_STEP)

    def mark(self, step: int) -> None:
        """Step `step` finished (training time only: boundaries are excluded via paused())."""
        self._marks[step] = time.perf_counter() - self._paused

    def paused(self, seconds: float) -> None:
        self._paused += seconds

    def step_seconds(self, plan_step: int, start: int) -> float:
        lo = max(start + 1, (start + plan_step) // 2)
        a, b = self._marks.get(lo), self._marks.get(plan_step)
        if a is None or b is None or plan_step <= lo:
            return float("nan")
        return (b - a) / (plan_step - lo)

    def seconds_since(self, a: int, b: int) -> float:
        """Training seconds per step over steps a+1..b (nan where either is not marked)."""
        ta, tb = self._marks.get(a), self._marks.get(b)
        return (tb - ta) / (b - a) if ta is not None and tb is not None and b > a else float("nan")

    def plan(self, step: int, step_s: float, boundary_s: float, eval_every: int) -> int:
        """The total step count that fits the rest of the budget."""
        left = self.seconds - self.elapsed()
        per_step = step_s + boundary_s / max(eval_every, 1)
        more = int(left / per_step) if per_step > 0 and math.isfinite(per_step) else 0
        self.planned = True
        return step + max(more, 0)

    def overrun(self) -> bool:
        return self.enabled and self.elapsed() > OVERRUN * self.seconds
