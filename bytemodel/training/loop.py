"""The training loop: corpus -> batches -> forward/backward -> AdamW -> checkpoints and metrics.

    run = prepare(tc)            # training/prepare.py: settings resolved and frozen, corpus, model config
    Loop(world, run, ...).run()  # steps until the plan, the time budget, patience or Ctrl-C end it

Exact resume: the sampler is a pure function of (seed, step) and the checkpoint holds the weights,
both AdamW moments, the optimizer's step count, the loss scale and the loop's own state (LoopState:
the planned step count, the schedule's extension, why it stopped), so k steps + resume to n gives
the same weights, bit for bit, as n steps straight (shown on the CPU backend, on one machine).

One path for every backend: the loop calls the op table (ops.global_norm, ops.adamw_step,
ops.fetch_async) and never asks which device it runs on.

Ctrl-C: the first press asks the loop to stop after the current step, save and exit; a second
press interrupts before the next step or validation batch, as `kill` does (errors.raise_soon;
the last saved checkpoint is still intact: saves are atomic).
"""
from __future__ import annotations

import dataclasses
import json
import math
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .. import checkpoint as ckpt
from ..config import TrainConfig
from ..errors import BytemodelError, CheckpointError, ConfigError, held, named, poll, raise_soon
from ..model import Dropout, Model
from ..ops import get_backend, resolve_device
from ..runfiles import lock_run, new_folders, remove_failed_run, trim_metrics
from ..validation import note_ignored_on_resume
from . import distributed, plateau
from .runner import Runner
from .autoconf import VAL_SHARE, dropout_at_plan, dropout_passes, eval_cadence, planned_passes
from .budget import REPLAN_STEPS, Budget
from .saver import Saver
from .optim import LossScaler, extend_schedule, lr_at
from .prepare import Run, next_run_dir, nucleotide_data, prepare_ranks
from .progress import Progress
from .watch import Watch

LN2 = math.log(2)
METRICS_FILE = "metrics.jsonl"
UNPLANNED = 10 ** 9   # the planned steps of a time-budget run until its total is planned (training/budget.py)
SAVE_SHARE = 0.1      # skip a boundary's resume checkpoint if writing it would cost more than this
SAVE_ALWAYS_S = 1.0   # share of the time since the last one and over SAVE_ALWAYS_S seconds (the
                      # base preset's is ~1 GB); the last step, a stop and early stopping always save


@dataclass
class TrainResult:
    run_dir: Path
    checkpoint: Path                 # the resume checkpoint (the latest weights)
    step: int
    val_bpb: float | None            # the best validation (the weights load() gives by default)
    train_loss: float | None
    interrupted: bool = False
    history: list = field(default_factory=list)
    best_checkpoint: Path | None = None
    best_step: int = 0
    last_val_bpb: float | None = None
    val_se: float | None = None      # standard error of the best validation figure
    stop_reason: str = ""
    baselines: dict | None = None
    warnings: list = field(default_factory=list)
    main: bool = True                # False on MPI ranks other than 0 (they write and print nothing)


@dataclass
class LoopState:
    """What the run decides as it trains, as opposed to its settings (TrainConfig, frozen). `planned`,
    `lr_from` and `stop_reason` go into every checkpoint (train_state["loop"]); the rest is there already."""
    step: int = 0                    # optimizer steps done
    planned: int = 0                 # the steps the run takes: tc.steps, or the time budget's plan
    lr_from: list = field(default_factory=list)   # [step, lr]: a resume changed the plan there; the
                                     # rate decays from lr to the floor at `planned` (optim.extend_schedule)
    stop_reason: str = ""            # why the run stopped ("" while it runs)
    cuts: list = field(default_factory=list)   # steps after which the plateau schedule cut the rate
                                     # and went back to the best weights (training/plateau.py)
    val_bpb: float | None = None     # the last validation (None before the first, or not finite)
    val_se: float | None = None
    loss: float | None = None        # the last step's training loss
    interrupted: bool = False
    eval_every: int = 0              # steps between validations the time budget's plan set (autoconf.eval_cadence);
                                     # 0: the settings' (tc.eval_every)

    def to_dict(self) -> dict:
        return {"planned_steps": self.planned, "lr_from": self.lr_from, "stop_reason": self.stop_reason,
                "cuts": self.cuts, "eval_every": self.eval_every}


def saved_eval_every(loaded) -> int:
    """The cadence a checkpoint's plan set (0 where it set none, or is older than the rule), checked."""
    loop = loaded.train.get("loop", {})
    n = loop.get("eval_every", 0) if isinstance(loop, dict) else 0
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise CheckpointError(f"{loaded.path}: the training state's eval_every is not valid ({n!r})")
    return n


def loss_weights(mask, scale: float, shape: tuple[int, int]):
    """The per-token weights of a batch (B, T): d(objective)/d(each target's loss), the one place
    the loss is normalised (the runner splits them with the rows, the model applies them).
    mask None: the mean over every target, times the loss scale (a number); else the mean over
    the counted targets, scale * mask / counted ((B, T) host array). -> (weights, counted or None)."""
    if mask is None:
        return scale / (shape[0] * shape[1]), None
    counted = max(int(np.count_nonzero(mask)), 1)
    return mask * (scale / counted), counted


def planned_steps(tc: TrainConfig, loaded, asked: int, budget: Budget) -> int:
    """The steps the run plans: UNPLANNED until a time budget's plan; the steps asked for on
    resume; else the checkpoint's plan (an older checkpoint kept it as its settings' steps)."""
    if budget.enabled and not budget.planned:
        return UNPLANNED
    if loaded is None or asked:
        return tc.steps
    saved = loaded.train.get("loop", {})
    n = saved.get("planned_steps", tc.steps) if isinstance(saved, dict) else None
    if isinstance(n, bool) or not isinstance(n, int) or n <= 0 or not isinstance(saved.get("stop_reason", ""), str):
        raise CheckpointError(f"{loaded.path}: the training state's loop state is not valid ({saved!r})")
    return n


def saved_schedule(loaded) -> tuple[int, list]:
    """The checkpoint's plan and schedule extension -> (planned steps, lr_from). Older checkpoints
    have no extension ([]) and, older still, no loop state: their plan was the settings' steps."""
    saved = loaded.train.get("loop", {})
    if not isinstance(saved, dict):
        saved = None
    else:
        n, lf = saved.get("planned_steps", loaded.train["config"].get("steps")), saved.get("lr_from", [])
        number = lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)  # noqa: E731
        if (not isinstance(n, bool) and isinstance(n, int) and n > 0 and isinstance(lf, list)
                and (lf == [] or (len(lf) == 2 and all(number(v) for v in lf) and float(lf[0]).is_integer()
                                  and lf[0] >= 0 and lf[1] >= 0))):
            return n, [int(lf[0]), float(lf[1])] if lf else []
    raise CheckpointError(f"{loaded.path}: the training state's loop state is not valid ({saved!r})")


class _StopFlag:
    """First SIGINT sets the flag (stop after this step); a second raises KeyboardInterrupt (at the
    loop's next poll)."""

    def __init__(self):
        self.set = False
        self._old = None

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            self._old = signal.signal(signal.SIGINT, self._handle)
        return self

    def _handle(self, signum, frame):
        if self.set:
            raise_soon(KeyboardInterrupt())   # at once, or when the step's threads are done
        self.set = True

    def __exit__(self, *exc):
        if self._old is not None:
            signal.signal(signal.SIGINT, self._old)


def _clean(rec: dict) -> dict:
    """Non-finite floats -> None (JSON has no NaN), flagged, so a NaN never slips into the metrics."""
    bad = [k for k, v in rec.items() if isinstance(v, float) and not math.isfinite(v)]
    for k in bad:
        rec[k] = None
    if bad:
        rec["nonfinite"] = bad
    return rec


def train(tc: TrainConfig, resume: bool = False, progress: bool = True, log=print,
          stop_at: int | None = None, given: dict | None = None) -> TrainResult:
    """Train (or resume) a run as `tc` describes. Returns where it ended.

    Keeps the lowest-validation weights in best.safetensors beside the resume checkpoint, stops
    early after `patience` validations without a new best, plans its length from a time budget
    (`minutes`), and writes loss.png at the end.
    stop_at: behave as if Ctrl-C came during that step (save and stop), for tests and scripts.
    given: the settings the caller set explicitly; on resume, those the run overrides are named.
    Started by mpiexec/srun (or with distributed="mpi"), every rank calls this and trains its
    slice of each batch (see training/distributed.py); only rank 0 writes and logs.
    A fresh run that fails before its first checkpoint removes the files and folders it made.
    """
    world = distributed.connect(tc.distributed)
    made, armed, lock = [], False, None
    try:
        if not resume and world.main:
            tc.validate()
            if not tc.out_dir and tc.source:
                tc = dataclasses.replace(tc, out_dir=str(next_run_dir(tc.source)))
            if tc.out_dir and Path(tc.out_dir).exists() and not Path(tc.out_dir).is_dir():   # was "File exists"
                raise ConfigError(f"{named('--out', 'out_dir')} {tc.out_dir} is a file, not a run directory")
            if tc.out_dir and not (Path(tc.out_dir) / ckpt.CKPT_NAME).exists():
                made = new_folders(Path(tc.out_dir))
        if world.main and tc.out_dir and (not resume or Path(tc.out_dir).is_dir()):
            if not resume:
                Path(tc.out_dir).mkdir(parents=True, exist_ok=True)
            lock = lock_run(Path(tc.out_dir))     # one writer per run folder, for the run's life
            armed = not resume and not (Path(tc.out_dir) / ckpt.CKPT_NAME).exists()
        run = prepare_ranks(world, tc, resume)
        if run.loaded is not None and given and world.main:
            note_ignored_on_resume(run.loaded.train["config"], given, log, run.loaded.cfg)
        return Loop(world, run, progress, log, stop_at, asked=tc.steps if resume else 0).run()
    except BaseException as e:
        if armed and not (Path(tc.out_dir) / ckpt.CKPT_NAME).exists():
            remove_failed_run(Path(tc.out_dir), made)
        world.fail(e)   # several ranks: report once and end the whole job; one process: re-raise
        raise
    finally:
        if lock is not None:
            lock.release()


def _snapshot(host, source):
    """`host` (a host copy of the array `source`) as an array the next steps will not change:
    on the NumPy backend to_numpy is `source` itself, updated in place, so it is copied."""
    if host is not None and isinstance(source, np.ndarray) and np.shares_memory(host, source):
        return host.copy()
    return host


class Loop:
    """One run's training: the model on its backend, the runner over threads and ranks, the
    optimizer, and what the run decides as it goes (self.state, a LoopState).

    asked: the step count given on resume (0: the run's own plan)."""

    def __init__(self, world, run: Run, progress: bool, log, stop_at: int | None = None, asked: int = 0):
        tc, cfg = run.tc, run.cfg
        self.world, self.run_, self.tc, self.cfg, self.corpus = world, run, tc, cfg, run.corpus
        self.stop_at = stop_at
        self.device = resolve_device(tc.device)
        world.use_device(self.device)            # this rank's GPU, and NCCL between the ranks' GPUs
        self.ops = get_backend(self.device, tc.precision)
        self.model = Model(cfg, self.ops)
        # this rank's rows of each batch, split again over CPU cores (1 worker on a GPU)
        self.runner = Runner(self.model, world, tc.batch_size, tc.workers or None, tc.shard_optimizer)
        self.opt = self.runner.optimizer(betas=(tc.beta1, tc.beta2), weight_decay=tc.weight_decay)
        self.log, self.progress = (log, progress) if world.main else ((lambda *a: None), False)
        self.scaler = LossScaler(enabled=(tc.precision == "fp16"))
        self.state = LoopState()
        self._restore(run.loaded)
        saved = run.loaded.train if run.loaded is not None else {}
        self.budget = self._budget(saved)
        self.state.planned = planned_steps(tc, run.loaded, asked, self.budget)
        if run.loaded is not None and self.state.planned <= self.state.step:
            raise ConfigError(f"the run is already at step {self.state.step}; "
                              f"give {named('--steps', 'steps')} larger than that to continue")
        self.schedule_note = self._schedule(run.loaded)
        self.state.val_bpb, self.state.val_se = saved.get("val_bpb"), saved.get("val_se")
        self.plan_at = (self.budget.plan_step(tc.warmup, self.state.step)
                        if self.budget.enabled and not self.budget.planned else None)
        self.replan_from = None      # the plan's step, when its dropout makes the steps dearer (_replan)
        stored = (run.loaded.train.get("config") or {}) if run.loaded is not None else {}
        # a time budget resumed with --steps before its plan (prepare._reopen): the steps are the plan,
        # and `--dropout auto` is decided by them at the start, as the plan would have
        self.steps_for_budget = (run.loaded is not None and not self.budget.enabled
                                 and isinstance(stored.get("minutes"), (int, float)) and stored["minutes"] > 0
                                 and not saved.get("budget_planned", False))
        self.watch = Watch.from_state(saved.get("watch"), tc.patience)
        self.best_host = None        # the plateau schedule's copy of the best weights (host, flat)
        self.T = cfg.context
        self.bytes_per_token = self.corpus.n_bytes / len(self.corpus.tokens)
        self.tokens_per_epoch = max(len(self.corpus.train), 1)
        self.metrics_path = run.run_dir / METRICS_FILE
        if world.main:   # lines past the checkpoint (a kill came between), or one cut short, go
            trim_metrics(self.metrics_path, self.state.step)
        self.history, self.warnings = [], []
        self.start = self.state.step
        self.saves = {"at": 0.0, "cost": 0.0}
        self.saver = Saver()    # the checkpoint writes, beside the training (training/saver.py)
        self.t_last, self.tok_since = time.perf_counter(), 0
        self.bar = None

    def _restore(self, loaded) -> None:
        """The weights, moments, loss scale and step of the checkpoint; or fresh weights."""
        if loaded is None:
            self.model.init_weights(self.tc.seed)
            if self.tc.parent:  # fine-tuning starts from the parent's weights (fresh optimizer state)
                from ..lineage import parent_weights
                self.model.load_flat(parent_weights(self.tc, self.cfg))
            return
        self.model.load_flat(loaded.params)
        if loaded.m is None:
            raise CheckpointError(f"{loaded.path} has no optimizer state; it cannot be resumed")
        self.opt.load_state(loaded.train["optim"], loaded.m, loaded.v)
        self.scaler.load_state(loaded.train.get("scaler", {"scale": self.scaler.scale, "good": 0}))
        self.state.step = int(loaded.train["step"])

    def _schedule(self, loaded) -> str:
        """A resumed run's schedule: the checkpoint's extension, extended again when the resume
        changes the plan (the rate goes on from where it was); one line saying so, or ""."""
        st = self.state
        if loaded is None:
            return ""
        old, st.lr_from = saved_schedule(loaded)
        st.cuts = plateau.saved_cuts(loaded)
        st.eval_every = saved_eval_every(loaded)
        if st.planned == UNPLANNED or old == UNPLANNED:   # a time budget not yet planned: its own rule
            return ""
        st.lr_from, note = extend_schedule(self.tc, st.step, old, st.planned, st.lr_from)
        return note

    def lr(self, s: int) -> float:
        """The learning rate of (0-based) step s."""
        tc = self.tc
        base = lr_at(s, tc.lr, tc.warmup, self.state.planned, tc.min_lr_ratio, self.state.lr_from)
        return plateau.rate(base, s, self.state.cuts, tc.min_lr_ratio * tc.lr)

    def _budget(self, saved: dict) -> Budget:
        spent_before, planned = saved.get("train_seconds", 0.0), saved.get("budget_planned", False)
        if (not isinstance(spent_before, (int, float)) or isinstance(spent_before, bool)
                or not isinstance(planned, bool)):
            raise CheckpointError(f"{self.run_.loaded.path}: the training state's time budget is not valid")
        return Budget(self.tc.minutes, float(spent_before), planned)

    # ------------------------------------------------------------------ the loop
    def run(self) -> TrainResult:
        """Step until the plan, the time budget, patience or a stop request ends the run.

        The loop runs "ahead": step s is queued before step s-1's loss and norm are read, so a GPU
        never waits for Python (on the CPU the values are simply ready). The gradient norm, the
        clip and the skip of a non-finite step happen in the backend (ops.global_norm,
        ops.adamw_step); the loss scale follows the host's reading one step late. Steps that end
        at a validation/checkpoint are settled first, so what is saved is exactly the state after
        that step."""
        st, tc, world, budget = self.state, self.tc, self.world, self.budget
        self._announce()
        if self.steps_for_budget and -1 in (tc.dropout, tc.dropout_attn):
            self._auto_dropout(nucleotide_data(self.corpus, self.run_.tok), timed=True)
        self.bar = Progress(self.progress, None if st.planned == UNPLANNED else st.planned, st.step)
        try:
            with _StopFlag() as stop, self.bar, held():   # a `kill` is raised at poll(): errors.py
                pending = None
                while st.step < st.planned:
                    poll()
                    if budget.enabled and world.any(budget.overrun()) and st.planned > st.step + 1:
                        st.planned = st.step + 1           # out of time: this step is the last
                        st.stop_reason = f"time budget: {tc.minutes:g} min used up"
                    launched = self.launch(st.step)
                    st.step += 1
                    if self.stop_at is not None and st.step >= self.stop_at:
                        stop.set = True
                    stop.set = world.any(stop.set)   # a Ctrl-C seen by one rank stops all at the same step
                    if pending is not None:           # the previous step, queued ahead: read it now
                        self.finish(st.step - 1, *self.settle(pending), boundary=False)
                        pending = None
                    at_plan = st.step == self.plan_at
                    boundary = st.step % self.every == 0 or st.step == st.planned or stop.set or at_plan
                    if boundary:
                        spent = self.finish(st.step, *self.settle(launched), boundary=True,
                                            stopping=stop.set, at_plan=at_plan)
                    else:
                        pending = launched
                    if at_plan:
                        self._plan(spent)
                    elif boundary and self.replan_from is not None and st.step - self.replan_from >= REPLAN_STEPS:
                        self._replan(spent)
                    if st.stop_reason:                # decided at the boundary, saved with it
                        break
        except BaseException:
            self.saver.close(quiet=True)   # what was queued lands (or fails) before the error goes on
            self.runner.close()
            if tc.plot and world.main and (self.run_.run_dir / ckpt.CKPT_NAME).exists():
                _plot_quietly(self.run_.run_dir, self.log)   # the curve up to the error (a run with no checkpoint is removed)
            raise
        self.saver.close()
        self.runner.close()
        world.close()
        return self._result()

    def launch(self, s: int):
        """Queue step s (0-based) and return what settle() needs to read its outcome."""
        tc, runner, ops, T = self.tc, self.runner, self.ops, self.T
        x, y, mask = self.corpus.sample(tc.batch_size, T, tc.seed, s)   # the whole batch (B, T)
        scale = self.scaler.scale
        weights, counted = loss_weights(mask, scale, x.shape)
        drop = Dropout(tc.seed, s) if self.cfg.dropout or self.cfg.dropout_attn else None   # masks from (seed, step)
        self.model.grads[...] = 0
        losses = runner.loss_and_grad(x, y, weights, drop)   # this rank's rows; gradients summed over ranks
        lr = self.lr(s)
        ntok = tc.batch_size * T                    # the whole batch, over all ranks
        norm = runner.grad_norm_device()            # of the scaled gradients; no host wait
        self.opt.step(lr, grad_scale=1.0 / scale, clip=tc.grad_clip, norm=norm)
        return s, ops.fetch_async(runner.mean_loss(losses, counted), norm), scale, ntok

    def settle(self, pending):
        """Read a launched step's loss and gradient norm; update the loss scale; -> (loss, norm, tokens)."""
        s, fetch, scale, ntok = pending
        loss, norm_scaled = fetch()
        norm = norm_scaled / scale
        finite = math.isfinite(norm) and math.isfinite(loss)
        if not self.scaler.update(finite) and not self.scaler.enabled:
            raise BytemodelError(f"training diverged at step {s + 1} (loss {loss}); try a lower {named('--lr', 'lr')}"
                                 + self.watch.best_note())
        note = self.watch.step(s + 1, loss, finite, self.scaler.scale, LossScaler.FLOOR, self.scaler.enabled)
        if note:
            self.warn(note)
        return loss, norm, ntok

    def finish(self, done: int, loss, norm, ntok, boundary: bool, stopping: bool = False,
               at_plan: bool = False) -> float:
        """Metrics for step number `done` (1-based); validation and a checkpoint at a boundary
        (stopping: a stop was asked for; at_plan: the time budget's plan step; both force the save).
        Returns the seconds the boundary took (0 without one)."""
        tc, st = self.tc, self.state
        st.loss = loss
        self.tok_since += ntok
        tps = self.tok_since / max(time.perf_counter() - self.t_last, 1e-9)
        epoch = done * tc.batch_size * self.T / self.tokens_per_epoch
        rec = {"step": done, "epoch": epoch, "loss": loss, "bpb": loss / LN2 / self.bytes_per_token,
               "grad_norm": norm, "lr": self.lr(done - 1),
               "tokens_per_s": tps, "bytes_per_s": tps * self.bytes_per_token, "time": time.time()}
        spent = 0.0
        if boundary:
            t0 = time.perf_counter()
            self._boundary(done, rec, epoch, stopping, at_plan)
            spent = time.perf_counter() - t0
            self.budget.paused(spent)
            self.t_last, self.tok_since = time.perf_counter(), 0
        else:
            self.record(rec)
        self.budget.mark(done)
        self.bar.update(done, rec, st.val_bpb, epoch)
        return spent

    def _boundary(self, done: int, rec: dict, epoch: float, stopping: bool, at_plan: bool) -> None:
        """Validate, decide whether the run stops here, record, save the resume checkpoint (and the
        best), say what happened."""
        st = self.state
        val, se = self.validate()
        new_best, notes = self.watch.validation(done, val, epoch, se)
        ok = math.isfinite(val)
        st.val_bpb, st.val_se = (val, se) if ok else (None, None)
        st.interrupted = stopping
        cut = self._cut(done, new_best)   # a stop here saves the cut too: the resume goes on as straight
        st.stop_reason = self._stop_reason(done, stopping)
        rec["val_bpb"], rec["val_se"] = val, se
        if cut:
            rec["cut_to"] = self.watch.best_step
        self.record(rec)   # before the save: a kill between the two leaves a line the resume trims
        keep = self.tc.schedule == "plateau" and (new_best or cut)   # a resume finds the best (plateau.py)
        params = self.save(stopping or at_plan or bool(st.stop_reason) or keep)
        if new_best and self.tc.schedule == "plateau":
            self.best_host = params.copy()
        if new_best and self.world.main:
            self.saver.submit(ckpt.save, self.run_.run_dir / ckpt.BEST_NAME, dataclasses.replace(self.cfg),
                              self.run_.tok, params, {**self.train_state(), "best": True})
        for n in notes:
            self.warn(n)
        if ok:
            self.bar.validation(done, epoch, rec["bpb"], val, se, new_best, rec["bytes_per_s"])

    def _cut(self, done: int, new_best: bool) -> bool:
        """The plateau schedule at a validation after step `done`: on a plateau, the best weights
        back and the rate cut from the next step on (training/plateau.py). -> whether it cut."""
        tc, st, w = self.tc, self.state, self.watch
        if (tc.schedule != "plateau" or new_best or w.best_val is None or done >= st.planned
                or not plateau.due(w.since_best, tc.patience, self.lr(done), tc.min_lr_ratio * tc.lr)):
            return False
        if self.best_host is None:   # a resumed process: from the checkpoint or best.safetensors
            self.best_host = plateau.best_weights(self.run_.loaded, w.best_step, self.run_.run_dir / ckpt.BEST_NAME)
        self.model.load_flat(self.best_host)
        st.cuts.append(done)
        since, w.since_best = w.since_best, 0
        self.note(f"schedule: no new best in {since} validations: back to the best weights "
                  f"(step {w.best_step}, {w.best_val:.4f} bits/byte); the rate from step {done + 1} is "
                  f"{self.lr(done):.3g} (cut {len(st.cuts)})")
        return True

    def _stop_reason(self, done: int, stopping: bool) -> str:
        """Why the run stops after step `done` ("" if it goes on): a stop request, patience, the
        time budget (decided before its last step), or the end of the plan, in that order."""
        tc, st = self.tc, self.state
        if stopping:
            return f"interrupted: saved step {done}; resume with --resume --out {self.run_.run_dir}"
        if self.watch.out_of_patience() and done != st.planned:   # at the plan's end: it finished
            return (f"stopped early at step {done}: no new best validation in {tc.patience} "
                    f"evaluations (--patience {tc.patience}; 0 turns this off)"
                    + (f"; the plateau schedule's rate is at its floor after {len(st.cuts)} cut(s)"
                       if tc.schedule == "plateau" else ""))
        if st.stop_reason or done != st.planned:
            return st.stop_reason
        return self._finished()

    def _finished(self) -> str:
        if self.budget.enabled:
            return f"finished the {self.state.planned} steps planned for {self.tc.minutes:g} min"
        return f"finished {self.state.planned} steps"

    def validate(self) -> tuple[float, float]:
        """Bits per byte of the held-out data and its standard error (corpus.score over the
        runner's window scorer: the batched scoring path of `score` and `eval`)."""
        return self.corpus.score(self.runner.nll, self.run_.tok, self.T, self.tc.eval_tokens,
                                 self.runner.score_batch)

    @property
    def every(self) -> int:
        """Steps between validations: the plan's cadence, else the settings'."""
        return self.state.eval_every or self.tc.eval_every

    def _plan(self, spent: float) -> None:
        """At the plan step of a time budget: fix the total from the measured step and boundary times,
        and the validation cadence where eval_every was left to the run: a run planned below the
        passes at which its data drops (so not expected to over-fit within the budget: the split of
        four genomes, a whole genome) validates at most VAL_SHARE of its training time
        (autoconf.eval_cadence) and is planned again with it; one expected to over-fit keeps the
        preset's cadence, which its plateau cuts and its best weights need."""
        st, budget, tc = self.state, self.budget, self.tc
        step_s = budget.step_seconds(self.plan_at, self.start)
        st.planned = self.world.bcast(max(budget.plan(st.step, step_s, spent, self.every), st.step))
        self.plan_at = None
        dna = self.run_.nucleotides   # prepare's on a fresh run's rank 0; else looked at here where it counts
        if dna is None:
            dna = (tc.minutes > 0 and not tc.parent and -1 in (tc.dropout, tc.dropout_attn)
                   and nucleotide_data(self.corpus, self.run_.tok))
        every = tc.eval_every
        if self.run_.eval_auto and planned_passes(st.planned, tc.batch_size, self.T,
                                                  len(self.corpus.train)) < dropout_passes(dna):
            every = eval_cadence(tc.eval_every, step_s, spent)
        st.eval_every = self.world.bcast(every if every != tc.eval_every else 0)
        if st.eval_every:
            st.planned = self.world.bcast(max(budget.plan(st.step, step_s, spent, self.every), st.step))
        self.bar.set_total(st.planned)
        cadence = (f"; validation every {self.every} steps (under {VAL_SHARE:.0%} of the training time: "
                   f"fewer passes planned than drop)" if st.eval_every else "")
        self.log(f"time budget {tc.minutes:g} min: {step_s * 1e3:.1f} ms/step and {spent:.1f} s per "
                 f"validation+save measured; {st.planned} steps planned{cadence}")
        if self._auto_dropout(dna) and (self.cfg.dropout or self.cfg.dropout_attn):
            self.replan_from = st.step   # its steps cost more now: timed again (budget.py)

    def _auto_dropout(self, dna: bool, timed: bool | None = None) -> bool:
        """`--dropout auto` decided by the passes the plan reads (autoconf.dropout_at_plan), said in
        one line; whether it was decided here."""
        st = self.state
        p, pa = dropout_at_plan(self.tc, st.planned, self.T, len(self.corpus.train), dna, timed)
        if p is None and pa is None:
            return False
        self.cfg.dropout = self.cfg.dropout if p is None else p
        self.cfg.dropout_attn = self.cfg.dropout_attn if pa is None else pa
        passes = planned_passes(st.planned, self.tc.batch_size, self.T, len(self.corpus.train))
        self.log(f"dropout auto: {passes:.1f} passes planned over the training tokens; dropout "
                 f"{self.cfg.dropout:g}, attention dropout {self.cfg.dropout_attn:g} from step {st.step + 1} "
                 f"(at least {dropout_passes(dna):g} passes drop{' on nucleotides' if dna else ''})")
        return True

    def _replan(self, spent: float) -> None:
        """The second plan of a run whose dropout came on at the first: the total from the steps since."""
        st, budget = self.state, self.budget
        step_s = budget.seconds_since(self.replan_from, st.step)
        self.replan_from = None
        if not math.isfinite(step_s):
            return
        st.planned = self.world.bcast(max(budget.plan(st.step, step_s, spent, self.every), st.step + 1))
        self.bar.set_total(st.planned)
        self.log(f"time budget {self.tc.minutes:g} min with dropout: {step_s * 1e3:.1f} ms/step measured; "
                 f"{st.planned} steps planned")

    # ------------------------------------------------------------------ records
    def train_state(self) -> dict:
        st = self.state
        return {"config": dataclasses.asdict(self.tc), "step": st.step, "optim": self.opt.state(),
                "scaler": self.scaler.state(), "corpus_sha256": self.corpus.sha256,
                "corpus_split": self.corpus.split, "val_bpb": st.val_bpb,
                "val_se": st.val_se, "n_bytes": self.corpus.n_bytes, "watch": self.watch.state(),
                "train_seconds": self.budget.elapsed(), "budget_planned": self.budget.planned,
                "loop": st.to_dict(), **({"data": self.run_.data} if self.run_.data is not None else {})}

    def save(self, force: bool):
        """The resume checkpoint (unless saving it would take over SAVE_SHARE of the time since the
        last one, and it is not forced); refuses non-finite weights. Returns the host weights.
        Every rank calls it (the moments may be gathered); rank 0 writes."""
        params = _snapshot(self.ops.to_numpy(self.model.params), self.model.params)   # written later
        if not np.isfinite(params).all():
            raise BytemodelError(f"the weights became non-finite at step {self.state.step}; not saved "
                                 f"(the checkpoints already written are intact); try a lower {named('--lr', 'lr')}")
        now, saves = time.perf_counter(), self.saves
        if self.world.any(force or saves["cost"] < SAVE_ALWAYS_S or saves["cost"] <= SAVE_SHARE * (now - saves["at"])):
            m, v = self.runner.host_moments(self.opt)             # gathered from the ranks when sharded
            if self.world.main:
                self.saver.submit(ckpt.save, self.run_.run_dir / ckpt.CKPT_NAME, dataclasses.replace(self.cfg),
                                  self.run_.tok, params, self.train_state(), _snapshot(m, self.opt.m),
                                  _snapshot(v, self.opt.v))
            saves["at"], saves["cost"] = time.perf_counter(), time.perf_counter() - now
        return params

    def record(self, d: dict) -> None:
        d = _clean(dict(d))   # a copy: the caller still prints its own figures
        self.history.append(d)
        if self.world.main:
            with open(self.metrics_path, "a") as f:
                f.write(json.dumps(d) + "\n")

    def note(self, text: str) -> None:
        if self.bar is not None and self.bar.enabled:
            self.bar.note(text)
        else:
            self.log(text)

    def warn(self, text: str) -> None:
        self.warnings.append(text)
        if self.bar is not None and self.bar.enabled:
            self.bar.note(text)
        else:
            self.log(text)

    def _announce(self) -> None:
        tc, cfg, corpus, st, run_dir = self.tc, self.cfg, self.corpus, self.state, self.run_.run_dir
        if self.run_.loaded is None:
            self.log(f"run {run_dir}: {corpus.n_bytes:,} bytes in {corpus.n_docs} document(s), "
                     f"{len(corpus.train):,} train / {len(corpus.val):,} val tokens; model {tc.parent or tc.preset} "
                     f"({cfg.d_model}x{cfg.n_layers}, context {self.T}), {self.device} {tc.precision}; "
                     f"batch {tc.batch_size}, lr {tc.lr:g}, warmup {tc.warmup}, "
                     + (f"time budget {tc.minutes:g} min" if self.budget.enabled else f"{st.planned} steps")
                     + (f", patience {tc.patience}" if tc.patience else "")
                     + (", plateau schedule" if tc.schedule == "plateau" else "")
                     + (", dropout auto (by the passes planned)" if -1 in (tc.dropout, tc.dropout_attn)
                        and tc.minutes > 0 and not tc.parent else "")
                     + (f", dropout {cfg.dropout:g}" if cfg.dropout else "")
                     + (f", attention dropout {cfg.dropout_attn:g}" if cfg.dropout_attn else ""))
        else:
            self.log(f"resuming {run_dir} at step {st.step} of "
                     f"{st.planned if st.planned != UNPLANNED else '(not yet planned)'}")
        for line in self.run_.notes + ((self.schedule_note,) if self.schedule_note else ()):
            self.log(line)

    def _result(self) -> TrainResult:
        tc, st, world, run_dir = self.tc, self.state, self.world, self.run_.run_dir
        if st.interrupted:
            self.log(f"interrupted: saved step {st.step} to {run_dir / ckpt.CKPT_NAME}; "
                     f"resume with --resume --out {run_dir}")
        st.stop_reason = st.stop_reason or self._finished()   # a budget used up at its plan step
        best_path = run_dir / ckpt.BEST_NAME
        base = None
        if tc.baseline and not st.interrupted and world.main:
            from .plot import run_baselines
            base = run_baselines(run_dir, tc)
        if tc.plot and world.main:
            _plot_quietly(run_dir, self.log)
        w = self.watch
        return TrainResult(run_dir, run_dir / ckpt.CKPT_NAME, st.step, w.best_val, st.loss, st.interrupted,
                           self.history, best_path if best_path.exists() else None, w.best_step, st.val_bpb,
                           w.best_se, st.stop_reason, base, self.warnings, world.main)


def _plot_quietly(run_dir: Path, log) -> None:
    """Write run_dir/loss.png; a missing matplotlib or a plotting error never fails a run."""
    try:
        from .plot import write_loss_png
        write_loss_png(run_dir)
    except ImportError:
        log("note: loss.png not written (pip install matplotlib)")
    except Exception as e:  # a chart must never cost a trained model
        log(f"note: loss.png not written ({type(e).__name__}: {e})")
