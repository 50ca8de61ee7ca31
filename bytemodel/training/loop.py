"""The training loop: corpus -> batches -> forward/backward -> AdamW -> checkpoints and metrics.

Exact resume: the sampler is a pure function of (seed, step) and the checkpoint holds the weights,
both AdamW moments, the optimizer's step count and the loss scale, so k steps + resume to n gives
the same weights, bit for bit, as n steps straight (shown on the CPU backend, on one machine).

One path for every backend: the loop calls the op table (ops.global_norm, ops.adamw_step,
ops.fetch_async) and never asks which device it runs on.

Ctrl-C: the first press asks the loop to stop after the current step, save and exit; a second
press interrupts at once (the last saved checkpoint is still intact: saves are atomic).
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
from . import distributed
from ..config import PRESETS, TrainConfig, preset as make_preset
from ..corpus import build_corpus, open_corpus, sample_batch, eval_windows
from ..errors import BytemodelError, CheckpointError, ConfigError, SourceError, TokenizerError
from ..model import Dropout, Model
from ..ops import get_backend, resolve_device
from .optim import LossScaler, lr_at
from ..runfiles import lock_run, new_folders, remove_failed_run, trim_metrics, verify_tokens
from ..pairs import ExampleCorpus, open_examples
from .budget import Budget
from .watch import Watch
from ..tokenizer import Tokenizer
from ..validation import note_ignored_on_resume, stored_train_config

LN2 = math.log(2)
METRICS_FILE = "metrics.jsonl"


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


def evaluate(runner, tokens: np.ndarray, tokenizer: Tokenizer, context: int, max_tokens: int,
             batch: int = 16, with_se: bool = False):
    """Validation (bits per byte, nats per token) on non-overlapping windows of `tokens`
    (max_tokens 0: all of them). with_se: also the standard error of the bits per byte, taking the
    windows as the sample (a ratio estimate: sum of bits / sum of bytes over windows)."""
    ops = runner.model.ops
    win_nll, win_tok, win_bytes = [], [], []
    full_x, full_y = [], []

    def run(xs, ys):
        x, y = np.concatenate(xs), np.concatenate(ys)
        losses = ops.to_numpy(runner.forward(ops.asarray(x), ops.asarray(y))).astype(np.float64)
        losses = losses.reshape(y.shape)
        win_nll.extend(losses.sum(axis=1))
        win_tok.extend([y.shape[1]] * y.shape[0])
        win_bytes.extend(tokenizer.token_lengths[y].sum(axis=1))

    for x, y in eval_windows(tokens, context, max_tokens or len(tokens) + context):   # 0: every window
        if x.shape[1] == context:
            full_x.append(x)
            full_y.append(y)
            if len(full_x) == batch:
                run(full_x, full_y)
                full_x, full_y = [], []
        else:
            run([x], [y])
    if full_x:
        run(full_x, full_y)
    nll, b = np.array(win_nll), np.array(win_bytes, dtype=np.float64)
    bpb = nll.sum() / LN2 / max(b.sum(), 1)
    out = (float(bpb), float(nll.sum() / max(sum(win_tok), 1)))
    if not with_se:
        return out
    n = len(nll)
    se = float("nan")
    if n > 1 and b.sum() > 0:   # delta-method variance of a ratio of means
        resid = nll / LN2 - bpb * b
        se = float(np.sqrt((resid ** 2).sum() / (n * (n - 1))) / b.mean())
    return out + (se,)


def _next_run_dir(source: str, root: Path = Path("runs")) -> Path:
    stem = Path(source.rstrip("/")).name.split(".")[0] or "run"
    for i in range(1, 10000):
        d = root / f"{stem}-{i}"
        if not d.exists():
            return d
    raise ConfigError(f"too many runs named {stem}-N under {root}")


class _StopFlag:
    """First SIGINT sets the flag (stop after this step); a second raises KeyboardInterrupt."""

    def __init__(self):
        self.set = False
        self._old = None

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            self._old = signal.signal(signal.SIGINT, self._handle)
        return self

    def _handle(self, signum, frame):
        if self.set:
            raise KeyboardInterrupt
        self.set = True

    def __exit__(self, *exc):
        if self._old is not None:
            signal.signal(signal.SIGINT, self._old)


def _make_tokenizer(tc: TrainConfig, documents_fn) -> Tokenizer:
    if tc.tokenizer:
        if tc.merges:
            raise ConfigError("give either --merges (learn them) or --tokenizer (a tok.json), not both")
        return Tokenizer.load(tc.tokenizer)
    if tc.merges == 0:
        return Tokenizer()
    return Tokenizer.train(documents_fn(), tc.merges)


def prepare(tc: TrainConfig, resume: bool = False):
    """Set up (or reopen) a run: directory, tokenizer, corpus, model config, loaded checkpoint."""
    if not resume:
        tc.validate()
    run_dir = Path(tc.out_dir) if tc.out_dir else None
    loaded = None
    if resume:
        if run_dir is None:
            raise ConfigError("--resume needs the run directory (--out DIR)")
        loaded = ckpt.load(run_dir)
        if tc.tokenizer:
            given = Tokenizer.load(tc.tokenizer)
            if given.merges != loaded.tokenizer.merges:
                raise TokenizerError(f"tokenizer {tc.tokenizer} does not match the checkpoint's "
                                     f"({given.n_merges} vs {loaded.tokenizer.n_merges} merges, or different ones)")
        stored = loaded.train.get("config")
        # settings that define the run come from the checkpoint (checked strictly: a checkpoint is
        # a file anyone can craft); steps may be extended
        tc = stored_train_config(TrainConfig, loaded.train, str(loaded.path), out_dir=str(run_dir),
                                 steps=tc.steps or (stored.get("steps", 0) if isinstance(stored, dict) else 0),
                                 device=tc.device, precision=tc.precision,
                                 distributed=tc.distributed, shard_optimizer=tc.shard_optimizer)
        if tc.precision == "auto":
            from .autoconf import auto_precision
            tc.precision = auto_precision(resolve_device(tc.device))
        tc.validate()
        tok = loaded.tokenizer
        corpus = open_examples(run_dir) if tc.examples else open_corpus(run_dir)
        if corpus.sha256 != loaded.train.get("corpus_sha256") \
                or loaded.train.get("corpus_split", corpus.split) != corpus.split \
                or loaded.train.get("n_bytes", corpus.n_bytes) != corpus.n_bytes:   # corpus.json's split and size too
            raise CheckpointError(f"the corpus in {run_dir} is not the one this checkpoint was trained on "
                                  f"(its tokens, split or size differ)")
        if isinstance(corpus, ExampleCorpus):     # tokens, mask and spans hashed again
            corpus.verify(loaded.cfg.vocab_size, run_dir)
        else:
            verify_tokens(corpus.tokens, corpus.sha256, loaded.cfg.vocab_size, run_dir)
        cfg = loaded.cfg
        if len(corpus.train) <= cfg.context or len(corpus.val) < 2:
            raise SourceError(f"corpus.json in {run_dir} is damaged: its split leaves no room for a "
                              f"window of context {cfg.context}")
        if tc.steps <= loaded.train.get("step", 0):
            raise ConfigError(f"the run is already at step {loaded.train.get('step')}; "
                              f"give --steps larger than that to continue")
        return tc, run_dir, tok, corpus, cfg, loaded
    if not tc.source:
        raise SourceError("no source given (--source PATH)")
    if tc.parent:  # fine-tuning: the parent's model and tokenizer, examples or plain data
        from .autoconf import resolve
        from ..lineage import prepare_finetune
        out = prepare_finetune(tc, _next_run_dir)
        if tc.preset == "auto":   # the auto settings (batch, validation interval) of the parent's size
            tc.preset = next((n for n, p in PRESETS.items() if p["d_model"] == out[4].d_model), "tiny")
        resolve(tc, resolve_device(tc.device))
        tc.validate()
        if tc.dropout >= 0:   # given: the fine-tune's own; otherwise the parent's
            from ..config import ModelConfig
            out = (*out[:4], ModelConfig.from_dict({**out[4].to_dict(), "dropout": tc.dropout}), out[5])
        return out
    if run_dir is None:
        run_dir = _next_run_dir(tc.source)
        tc.out_dir = str(run_dir)
    if (run_dir / ckpt.CKPT_NAME).exists():
        raise ConfigError(f"{run_dir} already holds a checkpoint; use --resume to continue it or another --out")
    ctx0 = tc.context or PRESETS["tiny" if tc.preset == "auto" else tc.preset]["context"]
    from ..readers import stream_documents   # merges learn from streamed pieces: no document held whole
    tok = _make_tokenizer(tc, lambda: stream_documents(tc.source, tc.reader or None))
    # streamed in bounded pieces, whatever the file size (with merges too: encode_chunks)
    corpus = build_corpus(None, tok, run_dir, tc.val_fraction, ctx0,
                          pieces=stream_documents(tc.source, tc.reader or None))
    if tc.reader:
        from ..readers import get_reader
        reader = get_reader(tc.reader)
        if reader.augments:                  # the reader adds copies of training documents
            from .augment import add_training_copies
            corpus = add_training_copies(run_dir, corpus, tok, reader.training_copies)
    from .autoconf import resolve
    from .runner import cores
    train_bytes = int(len(corpus.train) * corpus.n_bytes / max(len(corpus.tokens), 1))
    resolve(tc, resolve_device(tc.device), train_bytes, cores())
    tc.validate()
    ctx = tc.context or PRESETS[tc.preset]["context"]
    cfg = make_preset(tc.preset, tok.vocab_size, **{**tc.model, "context": ctx, "dropout": tc.dropout})
    return tc, run_dir, tok, corpus, cfg, None


def _open_prepared(d: dict):
    """A rank other than 0 opens the run rank 0 has just prepared (same settings, corpus, model)."""
    from ..config import ModelConfig
    tc = TrainConfig(**d["tc"])
    run_dir = Path(tc.out_dir)
    corpus = open_examples(run_dir) if tc.examples else open_corpus(run_dir)
    return tc, run_dir, Tokenizer.from_dict(d["tok"]), corpus, ModelConfig.from_dict(d["cfg"]), None


def _prepare_ranks(world, tc: TrainConfig, resume: bool):
    """prepare() on rank 0 (it may build the corpus); the other ranks then open the same run."""
    if resume:
        return distributed.on_rank0_first(world, lambda: prepare(tc, True), lambda _: prepare(tc, True))
    box = {}

    def first():
        box["out"] = out = prepare(tc, False)
        return {"tc": dataclasses.asdict(out[0]), "tok": out[2].to_dict(), "cfg": out[4].to_dict()}
    d = distributed.on_rank0_first(world, first, _open_prepared)
    return box["out"] if world.main else d


UNPLANNED = 10 ** 9   # tc.steps of a time-budget run until its total is planned (training/budget.py)
SAVE_SHARE = 0.1      # skip a boundary's resume checkpoint if writing it would cost more than this
SAVE_ALWAYS_S = 1.0   # share of the time since the last one and over SAVE_ALWAYS_S seconds (the
                      # base preset's is ~1 GB); the last step, a stop and early stopping always save


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
                tc.out_dir = str(_next_run_dir(tc.source))
            if tc.out_dir and not (Path(tc.out_dir) / ckpt.CKPT_NAME).exists():
                made = new_folders(Path(tc.out_dir))
        if world.main and tc.out_dir and (not resume or Path(tc.out_dir).is_dir()):
            if not resume:
                Path(tc.out_dir).mkdir(parents=True, exist_ok=True)
            lock = lock_run(Path(tc.out_dir))     # one writer per run folder, for the run's life
            armed = not resume and not (Path(tc.out_dir) / ckpt.CKPT_NAME).exists()
        return _train(world, tc, resume, progress, log, stop_at, given)
    except BaseException as e:
        if armed and not (Path(tc.out_dir) / ckpt.CKPT_NAME).exists():
            remove_failed_run(Path(tc.out_dir), made)
        world.fail(e)   # several ranks: report once and end the whole job; one process: re-raise
        raise
    finally:
        if lock is not None:
            lock.release()


def _train(world, tc: TrainConfig, resume: bool, progress: bool, log, stop_at, given=None) -> TrainResult:
    tc, run_dir, tok, corpus, cfg, loaded = _prepare_ranks(world, tc, resume)
    if loaded is not None and given and world.main:
        note_ignored_on_resume(loaded.train["config"], given, log, loaded.cfg)
    device = resolve_device(tc.device)
    world.use_device(device)            # this rank's GPU, and NCCL between the ranks' GPUs
    ops = get_backend(device, tc.precision)
    model = Model(cfg, ops)
    # this rank's rows of each batch, split again over CPU cores (1 worker on a GPU)
    runner = distributed.DataParallel(model, world, tc.batch_size, tc.workers or None, tc.shard_optimizer)
    opt = runner.optimizer(betas=(tc.beta1, tc.beta2), weight_decay=tc.weight_decay)
    if not world.main:
        log, progress = (lambda *a: None), False
    scaler = LossScaler(enabled=(tc.precision == "fp16"))
    step = 0
    state = loaded.train if loaded is not None else {}
    if loaded is not None:
        model.load_flat(loaded.params)
        if loaded.m is None:
            raise CheckpointError(f"{loaded.path} has no optimizer state; it cannot be resumed")
        opt.load_state(loaded.train["optim"], loaded.m, loaded.v)
        scaler.load_state(loaded.train.get("scaler", {"scale": scaler.scale, "good": 0}))
        step = int(loaded.train["step"])
    else:
        model.init_weights(tc.seed)
        if tc.parent:  # fine-tuning starts from the parent's weights (fresh optimizer state)
            from ..lineage import parent_weights
            model.load_flat(parent_weights(tc, cfg))

    spent_before, planned = state.get("train_seconds", 0.0), state.get("budget_planned", False)
    if not isinstance(spent_before, (int, float)) or isinstance(spent_before, bool) or not isinstance(planned, bool):
        raise CheckpointError(f"{loaded.path}: the training state's time budget is not valid")
    budget = Budget(tc.minutes, float(spent_before), planned)
    if budget.enabled and not budget.planned:
        tc.steps = UNPLANNED
    plan_at = budget.plan_step(tc.warmup, step) if budget.enabled and not budget.planned else None
    watch = Watch.from_state(state.get("watch"), tc.patience)
    T = cfg.context
    bytes_per_token = corpus.n_bytes / len(corpus.tokens)
    tokens_per_epoch = max(len(corpus.train), 1)
    metrics_path = run_dir / METRICS_FILE
    if world.main:   # lines past the checkpoint (a kill came between), or one cut short, go
        trim_metrics(metrics_path, step)
    history, warnings = [], []
    last_val, last_se = state.get("val_bpb"), state.get("val_se")
    last_loss = None
    stop_reason = ""
    start = step

    def train_state():
        return {"config": dataclasses.asdict(tc), "step": step, "optim": opt.state(),
                "scaler": scaler.state(), "corpus_sha256": corpus.sha256, "corpus_split": corpus.split, "val_bpb": last_val,
                "val_se": last_se, "n_bytes": corpus.n_bytes, "watch": watch.state(),
                "train_seconds": budget.elapsed(), "budget_planned": budget.planned}

    saves = {"at": 0.0, "cost": 0.0}

    def save(force: bool):
        """The resume checkpoint (unless saving it would take over SAVE_SHARE of the time since the
        last one, and it is not forced); refuses non-finite weights. Returns the host weights.
        Every rank calls it (the moments may be gathered); rank 0 writes."""
        params = ops.to_numpy(model.params)
        if not np.isfinite(params).all():
            raise BytemodelError(f"the weights became non-finite at step {step}; not saved "
                                 f"(the checkpoints already written are intact); try a lower --lr")
        now = time.perf_counter()
        if world.any(force or saves["cost"] < SAVE_ALWAYS_S or saves["cost"] <= SAVE_SHARE * (now - saves["at"])):
            m, v = runner.host_moments(opt)             # gathered from the ranks when sharded
            if world.main:
                ckpt.save(run_dir / ckpt.CKPT_NAME, cfg, tok, params, train_state(), m, v)
            saves["at"], saves["cost"] = time.perf_counter(), time.perf_counter() - now
        return params

    def record(d):
        d = _clean(dict(d))   # a copy: the caller still prints its own figures
        history.append(d)
        if world.main:
            with open(metrics_path, "a") as f:
                f.write(json.dumps(d) + "\n")

    def warn(text):
        warnings.append(text)
        if bar.enabled:
            bar.note(text)
        else:
            log(text)

    if loaded is None:
        log(f"run {run_dir}: {corpus.n_bytes:,} bytes in {corpus.n_docs} document(s), "
            f"{len(corpus.train):,} train / {len(corpus.val):,} val tokens; model {tc.parent or tc.preset} "
            f"({cfg.d_model}x{cfg.n_layers}, context {T}), {device} {tc.precision}; "
            f"batch {tc.batch_size}, lr {tc.lr:g}, warmup {tc.warmup}, "
            + (f"time budget {tc.minutes:g} min" if budget.enabled else f"{tc.steps} steps")
            + (f", patience {tc.patience}" if tc.patience else ""))
    else:
        log(f"resuming {run_dir} at step {step} of {tc.steps if tc.steps != UNPLANNED else '(not yet planned)'}")

    bar = _Progress(progress, None if tc.steps == UNPLANNED else tc.steps, step)
    interrupted = False
    t_last, tok_since = time.perf_counter(), 0
    # The loop runs "ahead": step s is queued before step s-1's loss and norm are read, so a GPU
    # never waits for Python (on the CPU the values are simply ready). The gradient norm, the
    # clip and the skip of a non-finite step happen in the backend (ops.global_norm,
    # ops.adamw_step); the loss scale follows the host's reading one step late. Steps that end
    # at a validation/checkpoint are settled first, so what is saved is exactly the state after
    # that step.

    def launch(s):
        """Queue step s (0-based) and return what settle() needs to read its outcome."""
        if isinstance(corpus, ExampleCorpus):  # fine-tuning examples: the loss counts masked targets
            x, y, mask = corpus.sample(tc.batch_size, T, tc.seed, s)   # the whole batch, for its count
            counted = max(int(mask.sum()), 1)
            x, y, mask = x[runner.rows], y[runner.rows], mask[runner.rows]
        else:
            x, y = sample_batch(corpus.train, tc.batch_size, T, tc.seed, s, rows=runner.rows)
            mask = counted = None
        model.grads[...] = 0
        scale = scaler.scale
        drop = Dropout(tc.seed, s) if cfg.dropout > 0 else None   # masks from (seed, step)
        losses = runner.loss_and_grad(ops.asarray(x), ops.asarray(y), weight=scale,   # summed over ranks
                                      mask=mask, counted=counted, drop=drop)
        lr = lr_at(s, tc.lr, tc.warmup, tc.steps, tc.min_lr_ratio)
        ntok = tc.batch_size * T                    # the whole batch, over all ranks
        norm = runner.grad_norm_device()            # of the scaled gradients; no host wait
        opt.step(lr, grad_scale=1.0 / scale, clip=tc.grad_clip, norm=norm)
        return s, ops.fetch_async(runner.mean_loss(losses), norm), scale, ntok

    def settle(pending):
        """Read a launched step's loss and gradient norm; update the loss scale; -> (loss, norm, tokens)."""
        s, fetch, scale, ntok = pending
        loss, norm_scaled = fetch()
        norm = norm_scaled / scale
        finite = math.isfinite(norm) and math.isfinite(loss)
        if not scaler.update(finite) and not scaler.enabled:
            raise BytemodelError(f"training diverged at step {s + 1} (loss {loss}); try a lower --lr"
                                 + watch.best_note())
        note = watch.step(s + 1, loss, finite, scaler.scale, LossScaler.FLOOR, scaler.enabled)
        if note:
            warn(note)
        return loss, norm, ntok

    def finish(done, loss, norm, ntok, boundary, force_save=False):
        """Metrics for step number `done` (1-based); validation and a checkpoint at a boundary.
        Returns the seconds the boundary took (0 without one)."""
        nonlocal last_val, last_se, last_loss, t_last, tok_since
        last_loss = loss
        tok_since += ntok
        tps = tok_since / max(time.perf_counter() - t_last, 1e-9)
        epoch = done * tc.batch_size * T / tokens_per_epoch
        rec = {"step": done, "epoch": epoch, "loss": loss, "bpb": loss / LN2 / bytes_per_token,
               "grad_norm": norm, "lr": lr_at(done - 1, tc.lr, tc.warmup, tc.steps, tc.min_lr_ratio),
               "tokens_per_s": tps, "bytes_per_s": tps * bytes_per_token, "time": time.time()}
        spent = 0.0
        if boundary:
            t0 = time.perf_counter()
            if isinstance(corpus, ExampleCorpus):   # no per-window spread there: no standard error
                from ..pairs import score_windows
                val = score_windows(lambda x, y: ops.to_numpy(runner.forward(ops.asarray(x), ops.asarray(y))),
                                    corpus.eval_windows(T, tc.eval_tokens), tok)["bits_per_byte"]
                se = float("nan")
            else:
                val, _, se = evaluate(runner, corpus.val, tok, T, tc.eval_tokens, with_se=True)
            new_best, notes = watch.validation(done, val, epoch, se)
            ok = math.isfinite(val)
            last_val, last_se = (val, se) if ok else (None, None)
            rec["val_bpb"], rec["val_se"] = val, se
            record(rec)   # before the save: a kill between the two leaves a line the resume trims
            params = save(force_save or done == tc.steps or watch.out_of_patience())
            if new_best and world.main:
                ckpt.save(run_dir / ckpt.BEST_NAME, cfg, tok, params, {**train_state(), "best": True})
            for n in notes:
                warn(n)
            if ok:
                bar.note(f"step {done} (epoch {epoch:.2f}): train {rec['bpb']:.3f}, "
                         f"val {val:.4f} ± {se:.4f} bits/byte" + (" (best)" if new_best else ""))
            spent = time.perf_counter() - t0
            budget.paused(spent)
            t_last, tok_since = time.perf_counter(), 0
        else:
            record(rec)
        budget.mark(done)
        bar.update(done, rec, last_val, epoch)
        return spent

    try:
        with _StopFlag() as stop, bar:
            pending = None
            while step < tc.steps:
                if budget.enabled and world.any(budget.overrun()) and tc.steps > step + 1:
                    tc.steps = step + 1           # out of time: this step is the last
                    stop_reason = f"time budget: {tc.minutes:g} min used up"
                launched = launch(step)
                step += 1
                if stop_at is not None and step >= stop_at:
                    stop.set = True
                stop.set = world.any(stop.set)   # a Ctrl-C seen by one rank stops all at the same step
                if pending is not None:           # the previous step, queued ahead: read it now
                    finish(step - 1, *settle(pending), boundary=False)
                    pending = None
                boundary = (step % tc.eval_every == 0 or step == tc.steps or stop.set or step == plan_at)
                if boundary:
                    spent = finish(step, *settle(launched), boundary=boundary,
                                   force_save=stop.set or step == plan_at)
                else:
                    pending = launched
                if step == plan_at:
                    step_s = budget.step_seconds(plan_at, start)
                    tc.steps = world.bcast(max(budget.plan(step, step_s, spent, tc.eval_every), step))
                    plan_at = None
                    bar.set_total(tc.steps)
                    log(f"time budget {tc.minutes:g} min: {step_s * 1e3:.1f} ms/step and {spent:.1f} s per "
                        f"validation+save measured; {tc.steps} steps planned")
                if stop.set:
                    interrupted = True
                    break
                if boundary and watch.out_of_patience():
                    stop_reason = (f"stopped early at step {step}: no new best validation in {tc.patience} "
                                   f"evaluations (--patience {tc.patience}; 0 turns this off)")
                    break
    except BaseException:
        runner.close()
        if tc.plot and world.main and (run_dir / ckpt.CKPT_NAME).exists():
            _plot_quietly(run_dir, log)   # the curve up to the error (a run with no checkpoint is removed)
        raise
    runner.close()
    world.close()
    if interrupted:
        stop_reason = f"interrupted: saved step {step}; resume with --resume --out {run_dir}"
        log(f"interrupted: saved step {step} to {run_dir / ckpt.CKPT_NAME}; resume with --resume --out {run_dir}")
    elif not stop_reason:
        stop_reason = (f"finished the {tc.steps} steps planned for {tc.minutes:g} min" if budget.enabled
                       else f"finished {tc.steps} steps")
    best_path = run_dir / ckpt.BEST_NAME
    base = None
    if tc.baseline and not interrupted and world.main:
        from ..plot import run_baselines
        base = run_baselines(run_dir, tc)
    if tc.plot and world.main:
        _plot_quietly(run_dir, log)
    return TrainResult(run_dir, run_dir / ckpt.CKPT_NAME, step, watch.best_val, last_loss, interrupted, history,
                      best_path if best_path.exists() else None, watch.best_step, last_val,
                      watch.best_se, stop_reason, base, warnings, world.main)


def _plot_quietly(run_dir: Path, log) -> None:
    """Write run_dir/loss.png; a missing matplotlib or a plotting error never fails a run."""
    try:
        from ..plot import write_loss_png
        write_loss_png(run_dir)
    except ImportError:
        log("note: loss.png not written (pip install matplotlib)")
    except Exception as e:  # a chart must never cost a trained model
        log(f"note: loss.png not written ({type(e).__name__}: {e})")

class _Progress:
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
