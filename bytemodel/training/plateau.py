"""The plateau schedule (`--schedule plateau`): on a validation plateau, go back to the best
weights and go on at a lower rate, instead of stopping.

Why (issue 27): a run on a few MB of data sees it dozens of times within its budget; its best
validation comes early (on the H200, the 1 MB Klebsiella sample was best near pass 11 of ~30),
while the cosine rate is still near its peak, and patience then ends the run at 67-79% of its
plan. A lower rate from the best weights is the part of the schedule that run never reached.

The rule, at a validation (training/loop.py asks `due` and then `cut`):
- PLATEAU_EVALS validations in a row without a new best, and a rate still above the floor
  (min_lr_ratio x lr): a cut. The weights go back to the best ones (best.safetensors'), the
  AdamW moments, the step count, the sampler and the dropout masks go on (all keyed by the
  step), and from the next step on the rate is CUT times what it would have been, never under
  the floor. Patience starts counting again.
- Otherwise as the cosine schedule: patience (--patience) ends the run, which with cuts left
  can only happen once the rate sits at its floor.
A run that never plateaus has exactly the cosine schedule's rates and bytes.

State: the steps at which cuts were made (LoopState.cuts, in every checkpoint). The best
weights come from this process's copy, or on resume from the resume checkpoint itself (when
the best was at its step) or best.safetensors (which must be the step the watch names). So
that a resume always finds them, the loop saves the resume checkpoint at every new best and
at every cut (before the best file, so a kill between leaves the first case).
"""
from __future__ import annotations

from ..errors import CheckpointError

SCHEDULES = ("cosine", "plateau")
PLATEAU_EVALS = 2   # validations without a new best that make a cut (patience's default is 5)
CUT = 0.5           # each cut multiplies the rate by this


def factor(s: int, cuts: list) -> float:
    """The multiplier of (0-based) step s's rate: CUT per cut made at or before it (a cut at
    boundary `c` = after c steps applies to steps c, c+1, ...)."""
    return CUT ** sum(1 for c in cuts if c <= s)


def rate(base: float, s: int, cuts: list, floor: float) -> float:
    """Step s's rate: the cosine schedule's `base`, times the cuts, never under `floor` (a rate
    already under it, in the warmup, is left as it is)."""
    if not cuts:
        return base
    return max(min(floor, base), base * factor(s, cuts))


def due(since_best: int, patience: int, lr_next: float, floor: float) -> bool:
    """A cut now? After PLATEAU_EVALS validations without a new best (or `patience`, if that is
    fewer and not 0: a cut comes before patience would stop the run), while the next step's rate
    is above the floor (relative margin: a cosine sitting at its floor is not cut again)."""
    evals = min(PLATEAU_EVALS, patience) if patience > 0 else PLATEAU_EVALS
    return since_best >= evals and lr_next > floor * (1 + 1e-6)


def saved_cuts(loaded) -> list:
    """The cuts a checkpoint records ([] for one from before the plateau schedule), checked."""
    loop = loaded.train.get("loop", {})
    cuts = loop.get("cuts", []) if isinstance(loop, dict) else None
    step = loaded.train.get("step")
    if (not isinstance(cuts, list) or not all(isinstance(c, int) and not isinstance(c, bool) for c in cuts)
            or any(not 0 < c <= step for c in cuts) or cuts != sorted(set(cuts))):
        raise CheckpointError(f"{loaded.path}: the training state's loop state is not valid (cuts {cuts!r:.80})")
    return list(cuts)


def best_weights(loaded, best_step: int, best_path):
    """On resume, the weights of the run's best validation (step best_step): the resume
    checkpoint's own when the best was at its step, else best.safetensors', which must be that
    step's."""
    from .. import checkpoint as ckpt
    if best_step == loaded.train.get("step"):
        return loaded.params.copy()
    try:
        best = ckpt.load(best_path)
    except (OSError, CheckpointError) as e:
        raise CheckpointError(f"the plateau schedule goes back to the best weights (step {best_step}), "
                              f"but {best_path} cannot be read: {e}") from None
    if best.train.get("step") != best_step or best.params.shape != loaded.params.shape:
        raise CheckpointError(f"{best_path} holds step {best.train.get('step')!r}, not the best step "
                              f"{best_step} the run's state names; the plateau schedule cannot go back to it")
    return best.params
