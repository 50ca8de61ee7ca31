"""Adapting while coding (dynamic evaluation): the model learns the file as it codes it.

    settings = Adapt(segment=16, lr=1e-3)         # into the container, whole
    ad = Adapter(model, replicas, bounds, lengths, settings, doc_id)
    ad.record(t, active, tokens)                  # after each step: what was just coded
    if ad.due(t): ad.update(run)                  # after each segment: one optimizer step

The streams advance together as without adaptation. After every `segment` steps (while tokens
remain), both sides take one optimizer step on the tokens just coded in every stream, starting
from the run's weights (or a seeded fresh model: `fresh`), so the encoder and the decoder hold the
same weights at every token. A training sequence per stream is its last `segment` tokens (the
targets) after `lookback` tokens of context (inputs only) and the token before the segment
(<doc> at a stream's start); a stream that has ended counts for nothing (mask 0). The objective is
the mean next-token loss over every counted target of every trained stream: with `stride` k > 1,
update u trains only the streams s with s % k == u % k (1/k of the cost: a step costs by the
tokens it trains on, not by its number; a fresh start's default is STRIDE_FRESH).

Determinism (bit-identical across thread counts and processes): the partition of every reduction
is fixed by the stream layout, never by the thread count. Each lane (a fixed, contiguous group of
streams, in the header) computes its gradient alone (forward and backward on its own replica,
BLAS held to one thread by the driver), into its own buffer; the lanes' buffers are added in lane
order; then one AdamW (or SGD) step over the flat buffer (ops.adamw_step, element-wise; the global
norm for clipping in float64). Threads only decide where a lane runs. The cached keys and values
of the tokens in the window stay as the previous weights computed them (both sides alike); the
next tokens use the new weights (cpu_engine.CpuLockstep.refold; the lockstep engine takes the new
weights() views).

Mixing (`mix`, default compress/mix2.NAME3 "ctx3"): the network's prediction is mixed with counts
of the file's own contexts and matches before it is quantised (compress/mix2.py; "ctx3" is "ctx2"
with its steps scaled down past 256 streams, the same bits up to them; "ctx1", compress/mix.py, is
the first mixer; older files name ctx1 or ctx2 and decode with it); "none" codes the network's
prediction alone (what files from before the mixer did). Where the model computes off the host
(a GPU) the default is "ctx3f" (compress/mix3f.py): ctx3's arithmetic on the model's device in a few
fused kernels, its state never crossing to the host; "ctx3d" (compress/mix3d.py, the same
arithmetic as ~100 CuPy calls a step, the default before ctx3f) still decodes. With NumPy both are
ctx3 bit for bit.

GPU: the same update through the CUDA backend (the lockstep engine, one lane on the device; at
fp16 / bf16 its step is one CUDA graph whose weights are refreshed after each update, the same bits
as Lockstep's launched step: compress/driver._adapt_steppers). Its
kernels give the same bits for the same inputs on the same GPU model (docs/GPU.md,
"Determinism"), so a decoder on that GPU model repeats the encoder's updates; the container names
the backend and another one is refused, as for every file.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

from ..errors import CompressError, ConfigError

OPTIMIZERS = ("adamw", "sgd")
MIX = "ctx3"                   # compress/mix2.NAME3: the mixer of new files
MIX_DEVICE = "ctx3f"            # compress/mix3f.py: ctx3 fused on the model's device, the mixer of new files on a GPU
MIXES = ("none", "ctx1", "ctx2", MIX, "ctx3d", MIX_DEVICE)   # ctx1 (compress/mix.py), ctx2, ctx3d (compress/mix3d.py):
                                                              # older files' mixers, which still decode
FRESH_SEED = 0                 # the seed of a fresh model's weights (`--adapt --preset P` without a checkpoint)
STRIDE_FRESH = 8               # a fresh model's updates train every 8th stream: 1/8 of the cost, and no larger
                               # (benchmarks/README.md, "Fewer streams per update")


@dataclass(frozen=True)
class Adapt:
    """The settings of adaptation (all in the container). Defaults: see DEFAULTS and fresh_defaults."""
    segment: int = 32           # steps (tokens per stream) between two updates (benchmarks/README.md: 16
                                # codes 0.2-0.8% smaller at 1.5x the time)
    lr: float = 3e-4            # a trained model: small steps keep what it knows
    optimizer: str = "adamw"
    beta1: float = 0.9
    beta2: float = 0.99
    eps: float = 1e-8
    weight_decay: float = 0.0   # no decay: the run's weights are the prior, not zero
    clip: float = 1.0           # global gradient norm
    lookback: int = 8           # context tokens before each segment in a training sequence (not targets)
    start: str = "checkpoint"   # or "preset:NAME" (a fresh model of that preset, seed FRESH_SEED)
    mix: str = MIX              # the network mixed with the file's counts (compress/mix2.py), ctx1, or "none"
    stride: int = 1             # an update trains every stride-th stream (phase: the update's number mod stride)

    def __post_init__(self):
        check(self)

    def header(self) -> dict:
        return asdict(self)

    @classmethod
    def from_header(cls, d) -> "Adapt":
        if isinstance(d, dict) and "mix" not in d:
            d = {**d, "mix": "none"}          # files from before the mixer: the network alone
        if isinstance(d, dict) and "stride" not in d:
            d = {**d, "stride": 1}            # files from before the stride: every stream trains
        if not isinstance(d, dict) or set(d) != set(cls.__dataclass_fields__):
            raise ValueError("unknown adaptation settings")
        try:
            return cls(**d)
        except ConfigError as e:
            raise ValueError(str(e)) from None


def check(a: Adapt) -> None:
    def num(v, lo=0.0, hi=math.inf, name=""):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not (lo <= v <= hi) or not math.isfinite(v):
            raise ConfigError(f"adapt {name} must be a number in [{lo}, {hi}], got {v!r}")
    for name in ("segment", "lookback", "stride"):
        v, lo = getattr(a, name), 0 if name == "lookback" else 1
        if isinstance(v, bool) or not isinstance(v, int) or v < lo or v > 4096:
            raise ConfigError(f"adapt {name} must be an integer in [{lo}, 4096], got {v!r}")
    num(a.lr, 0.0, 1.0, "lr")
    num(a.beta1, 0.0, 0.9999, "beta1")
    num(a.beta2, 0.0, 0.99999, "beta2")
    num(a.eps, 0.0, 1.0, "eps")
    num(a.weight_decay, 0.0, 1.0, "weight_decay")
    num(a.clip, 0.0, 1e6, "clip")
    if a.optimizer not in OPTIMIZERS:
        raise ConfigError(f"adapt optimizer must be one of {', '.join(OPTIMIZERS)}, got {a.optimizer!r}")
    if a.mix not in MIXES:
        raise ConfigError(f"adapt mix must be one of {', '.join(MIXES)}, got {a.mix!r}")
    if not isinstance(a.start, str) or not (a.start == "checkpoint" or a.start.startswith("preset:")):
        raise ConfigError(f"adapt start must be 'checkpoint' or 'preset:NAME', got {a.start!r}")


def settings(lm, segment=None, lr=None, optimizer=None, lookback=None, mix=None, stride=None) -> Adapt:
    """The settings for a model: a fresh one (lm.fresh_preset set) learns fast on every STRIDE_FRESH-th
    stream, a trained one gently on every stream."""
    fresh = getattr(lm, "fresh_preset", None)
    base = dict(lr=2e-3, start=f"preset:{fresh}", stride=STRIDE_FRESH) if fresh else {}
    if mix is None and not lm.model.ops.cpu_threads:
        mix = MIX_DEVICE                # the model off the host: the mixer beside it (a host mixer bounds the speed)
    given = {k: v for k, v in dict(segment=segment, lr=lr, optimizer=optimizer, lookback=lookback, mix=mix,
                                   stride=stride).items() if v is not None}
    return Adapt(**{**base, **given})


class Adapter:
    """The update that both sides of the coder take after every segment (see the module doc).

    model: the model the steps compute with (its params are updated in place; replicas share
    them); replicas[w]: worker w's model (own gradients and activations); bounds: the lanes'
    (first, end) streams; lengths (S,): tokens per stream."""

    def __init__(self, model, replicas, bounds, lengths, a: Adapt, doc_id: int):
        from ..training.optim import AdamW
        self.model, self.replicas, self.bounds, self.a = model, replicas, bounds, a
        self.lengths = np.asarray(lengths, dtype=np.int64)
        S, steps = len(lengths), int(lengths[0]) if len(lengths) else 0
        self.hist = np.zeros((S, steps + 1), dtype=np.int32)   # column j: the token of step j - 1
        self.hist[:, 0] = doc_id
        self.steps = steps
        xp = model.xp                                                  # the backend's arrays (NumPy or CuPy)
        self.grads = [xp.zeros_like(model.grads) for _ in bounds]      # one buffer per lane: a fixed partition
        self.opt = AdamW(model, betas=(a.beta1, a.beta2), eps=a.eps, weight_decay=a.weight_decay) \
            if a.optimizer == "adamw" else None
        self.updates = 0

    def record(self, t: int, active: int, tokens) -> None:
        self.hist[:active, t + 1] = tokens

    def due(self, t: int) -> bool:
        """After step t: is an update taken (a segment ended and tokens remain)?"""
        return (t + 1) % self.a.segment == 0 and t + 1 < self.steps

    def _lane(self, i: int, w: int, c0: int, c1: int, first: int, n_total: int) -> None:
        rows = self._rows(*self.bounds[i])
        if not len(rows):                              # none of this lane's streams trains this time
            self.grads[i][...] = 0
            return
        rep = self.replicas[w]
        x = np.ascontiguousarray(self.hist[rows, c0:c1 - 1], dtype=np.int64)      # (B, T) inputs
        y = np.ascontiguousarray(self.hist[rows, c0 + 1:c1], dtype=np.int64)      # (B, T) targets
        steps = np.arange(c0, c1 - 1)                                              # the step of each target
        mask = ((steps[None, :] >= first) & (steps[None, :] < self.lengths[rows, None])).astype(np.float32)
        rep.grads[...] = 0
        o = rep.ops
        rep.forward(o.asarray(x), o.asarray(y), mask)
        rep.backward(o.asarray(np.full(x.size, 1.0 / n_total, dtype=np.float32)))
        self.grads[i][...] = rep.grads

    def _rows(self, a: int, b: int) -> np.ndarray:
        """The streams of a..b that this update trains: those s with s % stride == updates % stride."""
        rows = np.arange(a, b)
        k = self.a.stride
        return rows if k == 1 else rows[rows % k == self.updates % k]

    def update(self, t: int, run) -> None:
        """One optimizer step on the segment that ended at step t. run(fn): call fn(i, w) for every
        lane i on its worker w (threads or not: the result is the same)."""
        a = self.a
        first = t + 1 - a.segment                     # the segment's first step
        c0, c1 = max(0, first - a.lookback), t + 2    # hist columns: inputs c0..t, targets c0+1..t+1
        n_total = int(np.clip(self.lengths[self._rows(0, len(self.lengths))] - first, 0, a.segment).sum())
        if n_total == 0:                              # fewer streams than the stride: none trains this time
            self.updates += 1
            return
        run(lambda i, w: self._lane(i, w, c0, c1, first, n_total))
        g = self.model.grads
        g[...] = self.grads[0]
        for lane in self.grads[1:]:                   # in lane order
            g += lane
        ops = self.model.ops
        norm = ops.global_norm(g)
        if self.opt is not None:
            self.opt.step(a.lr, clip=a.clip, norm=norm)
        else:
            n = float(norm)
            if math.isfinite(n):
                f = min(1.0, a.clip / (n + 1e-6)) if a.clip > 0 else 1.0
                self.model.params -= np.float32(a.lr * f) * g
        self.updates += 1


FRESH_PRECISION = "fp16"    # a fresh model's precision on a GPU unless --precision says otherwise (H200, small,
                            # 1 MB of English: fp16 255,519 bytes in 30.9 s, bf16 256,050 in 33.5 s, fp32 256,046
                            # in 67.1 s; fp32 keeps the reference attention, so no captured step: benchmarks/README.md,
                            # "The adapting step as a CUDA graph")


class Fresh:
    """A seeded fresh model of a preset with the byte tokenizer, in the shape the compressor reads
    from a loaded checkpoint (.model, .tokenizer, .cfg, .path, .train_state): a compressor that
    needs no training. The same preset and seed give the same weights on every machine."""

    def __init__(self, preset_name: str, device: str = "cpu", seed: int = FRESH_SEED, precision: str | None = None,
                 **overrides):
        """precision: on a GPU fp16, bf16 or fp32 (None: FRESH_PRECISION; the CPU computes in fp32
        whatever is asked); a file decodes with the precision its header names. overrides: model
        settings changed from the preset's (tests: a smaller model; a file compressed so decodes
        only with the same overrides, which the container does not hold)."""
        from ..config import preset
        from ..model import Model
        from ..ops import get_backend
        from ..tokenizer import Tokenizer
        self.tokenizer = Tokenizer()
        self.cfg = preset(preset_name, vocab=self.tokenizer.vocab_size, **overrides)
        self.model = Model(self.cfg, get_backend(device, precision or FRESH_PRECISION, strict=False))
        self.model.init_weights(seed)
        self.path, self.train_state, self.fresh_preset = None, {}, preset_name


def check_gpu(header: dict, lm) -> None:
    """An adapted file decodes only on the GPU model it was made on: its updates repeat bit for bit
    on the same chip and SM count (cuBLAS's promise, and our kernels'), not across chips."""
    made, here = header["backend"], lm.model.ops.describe()
    if made.get("device") == "cpu" or here.get("device") == "cpu":
        return                        # (the CPU: bit-identical on any machine; a device change is refused before)
    a = (made.get("gpu"), made.get("sm_count"))
    b = (here.get("gpu"), here.get("sm_count"))
    if a != b:
        raise CompressError(f"this file adapted on {a[0]} ({a[1]} SMs); this GPU is {b[0]} ({b[1]} SMs), where "
                            f"the updates would not repeat bit for bit: decompress it on a {a[0]}")


def check_start(header: dict, lm) -> None:
    """A file that adapted from a fresh model needs that fresh model, and one from a checkpoint that checkpoint."""
    start = header["adapt"]["start"]
    mine = f"preset:{lm.fresh_preset}" if getattr(lm, "fresh_preset", None) else "checkpoint"
    if start != mine:
        raise CompressError(f"this file adapted from {start.replace(':', ' ')}, not from "
                            f"{mine.replace(':', ' ')}: decompress it with "
                            + ("--adapt --preset " + start.split(':', 1)[1] if start != "checkpoint" else "its checkpoint"))
