"""Settings a run fills in for itself: the preset, its learning rate, warmup and batch, the precision.

A TrainConfig leaves these at their "auto" values (preset "auto", lr 0, warmup -1, batch_size 0,
eval_every 0, precision "auto"); `resolve(tc, device, train_bytes, cores)` replaces each one left so by the rules below,
and keeps every value the user gave. What it chose is stored in the checkpoint, so a resumed run
continues with the same settings.

Per-preset training defaults (PRESET_TRAIN), and where each comes from (benchmarks/README.md,
"Training defaults and the time budget"): tiny, the CPU figures the quick start has always used;
base, an lr sweep on the H200 at equal time (6e-4 beat 1.2e-3 by 0.008 bits/byte and tied 3e-4;
issue 10's 3000-step runs had 2e-3 plateau at 1.907 where 6e-4 reached 1.838) and the 5-minute
Klebsiella run; small, an lr/batch sweep on the shipped 1.2 MB sample (5e-4 to 4e-3, batch 32 and
64, all within one standard error of each other; 1e-3 kept).

The preset rule (`--preset auto`): the largest preset with at most PARAMS_PER_BYTE parameters per
byte of training data, because a model much larger than its data memorises it within a few
passes (issue 10: base on 3.8 MB was best after 6.5 passes, then got worse every evaluation).
On the CPU it stops at tiny, unless the machine has at least 8 cores (then small): a CPU step of
small costs about 12x one of tiny, too slow to finish in reasonable time on a laptop.
"""
from __future__ import annotations

import math

from ..config import PRESETS
from ..errors import ConfigError, named

# lr: peak AdamW learning rate; warmup: linear warmup steps; batch_size: windows per step.
# One line each, with the reason (figures: benchmarks/README.md, "Training defaults per preset").
# eval_every: steps between validations; at small/base a step takes ~15-50 ms on the H200, so a
# validation of the whole tail plus the saves every 100 steps would cost a large share of the run.
PRESET_TRAIN = {
    "tiny": dict(lr=2e-3, warmup=50, batch_size=16, eval_every=100),    # the quick start's settings
    "small": dict(lr=1e-3, warmup=100, batch_size=32, eval_every=250),  # sweep: 5e-4..4e-3 all alike
    "base": dict(lr=6e-4, warmup=200, batch_size=32, eval_every=250),   # sweep: best of 3e-4/6e-4/1.2e-3
}

VAL_SHARE = 0.05          # a time-budget run left the preset's eval_every validates (and saves) at most
                          # this share of its training time: its cadence is set at the plan step from
                          # the step and the validation+save measured there (eval_cadence). On the
                          # four-genome split (2M validation tokens, base, H100, 3.5 min) a validation and
                          # save took 1.5 s, 28 steps' time: every 250 steps that was 13 of them; the
                          # rule's 650 gave 3,455 steps and 1.6402 bits/base where 250 gave 3,310 and
                          # 1.6484 (benchmarks/README.md, "Validation kept to a share of the budget")
EVAL_ROUND = 50           # the cadence it sets is a multiple of this
NUCLEOTIDE_CONTEXT = 256  # base's window on training data that is all nucleotide codes, its batch scaled to
                          # keep base's 32,768 tokens a step (nucleotide_window). On the four-genome split
                          # (H200, 3.5 min alone, both warm) base at 256 x 128 stepped in 44.4 ms against
                          # 51.4 at 1,024 x 32 (attention is a fifth of base's work at 1,024) and scored
                          # the held-out file 1.5599 bits/base against 1.5979; 128 x 256 gave 1.6365
                          # (benchmarks/README.md, "A shorter window on nucleotides")
NUCLEOTIDE_CONTEXT_PRESETS = ("base",)   # where it was measured; small's 512 (the shipped sample) was not
PARAMS_PER_BYTE = 20      # at most this many parameters per training byte (see the preset rule)
CPU_SMALL_CORES = 8       # a CPU with at least this many cores may train small
CPU_EVAL_TOKENS = 2 ** 17  # on the CPU, validate on at most this many tokens of the tail (evenly
                           # spread windows; their standard error is reported): the whole tail of a
                           # few MB would take minutes per validation there
GPU_EVAL_TOKENS = 2 ** 21  # on a GPU, at most this many: ten photos' tail of 8.6M tokens scored
                           # whole every 250 steps left 2,575 base steps in 4 minutes on the H200
                           # (a run of 2026-12-02 before the cap),
                           # capped 2,891-2,962 (benchmarks/README.md, "Held-out photos and speech");
                           # 2,048 windows of 1,024 still give a standard error of ~0.017 there


def _preset_order(device: str, cores: int) -> list[str]:
    """The presets `--preset auto` may pick on this device, smallest first."""
    order = ["tiny", "small", "base"]
    if device == "cpu":
        order = order[:2] if cores >= CPU_SMALL_CORES else order[:1]
    return order


def auto_context(device: str, cores: int = 1) -> int:
    """The longest context `--preset auto` may give a run on this device (before its data decide)."""
    return max(PRESETS[p]["context"] for p in _preset_order(device, cores))


def auto_preset(train_bytes: int, device: str, cores: int = 1) -> str:
    """The preset `--preset auto` picks for `train_bytes` of training data on `device`."""
    from ..config import preset as make
    from ..model import n_params
    order = _preset_order(device, cores)
    pick = order[0]
    for name in order:
        if n_params(make(name)) <= PARAMS_PER_BYTE * train_bytes:
            pick = name
    return pick


DROPOUT_PASSES = 5.0   # planned passes over the training tokens from which a run drops (auto_dropout)
NUCLEOTIDE_DROPOUT_PASSES = 20.0   # the same for data that is all nucleotide codes (DNA is memorised later)
DROPOUT = 0.2          # the residual branches' and the embedding's drop probability where it drops
DROPOUT_ATTN = 0.2     # the attention probabilities'


def planned_passes(steps: int, batch_size: int, context: int, train_tokens: int) -> float:
    """How many times a run of `steps` steps of `batch_size` windows of `context` tokens reads its
    `train_tokens` training tokens."""
    return steps * batch_size * context / max(train_tokens, 1)


def dropout_passes(nucleotides: bool = False) -> float:
    """The planned passes from which `--dropout auto` drops: NUCLEOTIDE_DROPOUT_PASSES for training
    data whose every byte is a nucleotide code (nucleotide_data in training/prepare.py), else
    DROPOUT_PASSES."""
    return NUCLEOTIDE_DROPOUT_PASSES if nucleotides else DROPOUT_PASSES


def auto_dropout(passes: float, nucleotides: bool = False) -> float:
    """The dropout `--dropout auto` picks for a run that plans to read its training data `passes`
    times: DROPOUT from dropout_passes(nucleotides) passes on, else 0. A time-budget run knows its
    passes at the plan step (training/budget.py), so its dropout is 0 through the warmup and is
    decided there (training/loop.py); a run of --steps N knows them before its first step.

    From the H200 sweeps at equal time (benchmarks/README.md, "Dropout", "Held-out photos and
    speech, and stronger dropout" and "English, the four-genome split and speech"), by the passes
    each run made:
    - tens of passes (the shipped genome with its reverse strand, 2.1 MB, ~50 passes at small in
      5 minutes; three minutes of 16-bit speech, 2.8 MB): over-fits without it. On the sample 0.1
      1.7981, 0.2 with attention dropout 0.1 1.7906, 0.2 / 0.2 **1.7865**; on held-out speech
      0.2 / 0.2 spent 3.9% fewer bits than 0.1;
    - 6 passes (21.7 MB of English, base, 6 minutes alone): 0.2 / 0.2 **1.1568**, 0.1 / 0 1.1893,
      0.3 / 0.2 1.1710; validation rose past pass 6 even so;
    - under one pass (English in a minute; ten photos, 86 MB, 1.2 passes): every dropout cost
      (English +0.039 at 0.1, +0.055 at 0.2).
    So for other data the line lies between 1.2 and 6 passes; DROPOUT_PASSES = 5 (set when the DNA
    split below, at 3.9 passes, was taken as its lower bound).

    Nucleotides are memorised later, and their validation gains from it (a genome's tail has
    homologues in the rest of its data): on the 18 MB four-genome split at base, 0.2 / 0.2 cost
    0.025 bits/base at 3.9 passes (H200, shared) and **0.110** at 6.3 planned passes (H100, alone,
    3.5 minutes; "The four-genome split alone under the passes rule"), both runs still improving
    at their end; the sample at ~50 passes gains. So nucleotide data drops from
    NUCLEOTIDE_DROPOUT_PASSES = 20 planned passes (between 6.3 and ~50 the sweeps measured
    nothing). 20 keeps the split's 5-minute runs without it (6-9 passes) and the sample's with it;
    a whole 4-5 MB genome with its reverse strand plans about 13-17 passes at base in 5 minutes on
    the H200 (from the split's 3,933 steps there), so it trains without: that case was not measured
    either way. On the CPU a run reads its data a few times at most, so this rarely drops there."""
    return DROPOUT if passes >= dropout_passes(nucleotides) else 0.0


def auto_dropout_attn(passes: float, nucleotides: bool = False) -> float:
    """`--dropout-attn auto`: DROPOUT_ATTN where auto_dropout drops (the same sweeps), else 0.

    It pays for its cost: at base it makes a step ~9% dearer on the GPU, and yet half of linux-docs
    at base, the defaults against `--dropout-attn 0` at once on one H100 for 4.5 minutes (6.8
    passes, both with residual dropout 0.2), validated 1.4134 against 1.4505 bits/byte with 5.4%
    fewer steps (benchmarks/README.md, "Does attention dropout pay for its cost")."""
    return DROPOUT_ATTN if auto_dropout(passes, nucleotides) > 0 else 0.0


AUTO_TILE = 32             # the image tile side a run takes when its images' rows outrun its context


def auto_tile(width: int, channels: int, context: int) -> int:
    """The image reader's `tile` for an image `width` pixels wide of `channels` bytes a pixel, in a
    run whose context is `context` bytes (auto_context's while the preset is still auto): 0
    (whole rows) when a row fits the context, so the pixel above is within reach, or when even a
    tile's row and the one above it would not (a context too short for tiles to help);
    AUTO_TILE otherwise.

    From the H200 (benchmarks/README.md, "Photos in tiles"): ten mate-nature photos at full
    resolution (2560 wide: 7,680-byte rows against base's 1,024-byte context), base, 4 minutes
    each with the four runs sharing the GPU (~0.35 passes): validation per pixel byte, every bit
    charged to the pixels (tile headers included), rows 1.570, tile=16 1.557, tile=32 1.533
    (+-0.011 each). Narrower tiles put the pixel above nearer but start more tiles without one."""
    if width * channels <= context or 2 * AUTO_TILE * channels > context:
        return 0
    return AUTO_TILE


REVCOMP_SMALL_DATA = 8_000_000   # training bytes up to which a GPU run adds the reverse strand (auto_revcomp)


def auto_revcomp(train_bytes: int, device: str) -> bool:
    """Whether a nucleotide FASTA run whose reader leaves `revcomp` unset adds each training record's
    reverse complement (readers/fasta.py; training/augment.py).

    From the H200 runs at 5 minutes (benchmarks/README.md, "The reverse strand by default"): where
    a run sees its data many times over, the other strand is new data and helps: the shipped 1.07
    MB sample -0.008 to -0.013 bits/base at its best (small; four runs), one whole 5.1 MB genome
    -0.011 (base, 13 passes). Where it does not, it costs: the 18 MB four-genome split at 1.9
    passes +0.004; on the CPU at 1.2 passes nothing (-0.002). So: on a GPU up to
    REVCOMP_SMALL_DATA training bytes (between 5 and 18 MB nothing was measured), never on the CPU,
    whose runs see their data a few times at most."""
    return device != "cpu" and train_bytes <= REVCOMP_SMALL_DATA


INVERT_SMALL_DATA = 8_000_000    # training bytes up to which a GPU run adds each clip inverted (auto_invert)


def auto_invert(train_bytes: int, device: str) -> bool:
    """Whether an audio run whose reader leaves `invert` unset adds each training clip again with
    its polarity inverted (readers/audio.py; training/augment.py): the speech counterpart of the
    reverse strand, new data to a run that sees its clips many times over.

    From H100 runs of 5 minutes (benchmarks/README.md, "Speech with its polarity inverted"):
    codec2's twelve training clips (2.8 MB of pcm16 at 8 kHz), the two held-out clips 1,401,497
    bits with the defaults before (small, stopped by patience at 129 planned passes) and 1,356,207
    with the inverted copies in the same call (-3.2%; the doubled data makes `--preset auto` pick
    base, which ran to the budget's end), 1,353,196 with this rule alone on the GPU (-2.5% under
    FLAC -8). Not measured on more audio than that, nor on the CPU, whose runs see their data a
    few times at most: the same bounds as the reverse strand's."""
    return device != "cpu" and train_bytes <= INVERT_SMALL_DATA


def auto_precision(device: str, capability: tuple[int, int] | None = None) -> str:
    """fp32 on the CPU; bf16 on a GPU of compute capability >= 8.0 (Ampere on), else fp16."""
    if device == "cpu":
        return "fp32"
    if capability is None:
        from ..ops import gpu_capability
        capability = gpu_capability()
    return "bf16" if capability >= (8, 0) else "fp16"


def resolve(tc, device: str, train_bytes: int | None = None, cores: int = 1,
            train_tokens: int | None = None, nucleotides: bool = False) -> None:
    """Fill the auto fields of the draft settings `tc` in place (before prepare freezes them).
    A fresh run (train_tokens given) on nucleotides (`nucleotides`: its training data is all
    nucleotide codes) at base that left --context and --batch-size gets nucleotide_window's.
    The dropouts of a fresh run of --steps N are decided here; those of a time-budget run stay -1 (auto)
    until its plan step (dropout_at_plan); a fine-tune (no size here) keeps its parent's."""
    if tc.preset == "auto":
        if train_bytes is None:
            raise ConfigError(named('--preset auto', 'preset="auto"') + " needs the corpus size")
        tc.preset = auto_preset(train_bytes, device, cores)
    if tc.preset not in PRESET_TRAIN:
        raise ConfigError(f"unknown preset {tc.preset!r}; choose one of auto, {', '.join(PRESETS)}")
    d = PRESET_TRAIN[tc.preset]
    # nucleotides: a shorter window, the same tokens a step (a fresh run; both left to the run)
    window = nucleotide_window(tc.preset, d["batch_size"]) if nucleotides and train_tokens is not None else None
    if window and tc.context == 0 and tc.batch_size == 0:
        tc.context, tc.batch_size = window
    if tc.lr == 0:
        tc.lr = d["lr"]
    if tc.warmup < 0:
        tc.warmup = d["warmup"]
    if tc.batch_size == 0:
        tc.batch_size = d["batch_size"]
    if tc.eval_every == 0:
        tc.eval_every = d["eval_every"]
    if tc.eval_tokens == 0:
        tc.eval_tokens = CPU_EVAL_TOKENS if device == "cpu" else GPU_EVAL_TOKENS
    if tc.precision == "auto":
        tc.precision = auto_precision(device)
    if train_tokens is not None and tc.minutes <= 0:
        passes = planned_passes(tc.steps, tc.batch_size, tc.context or PRESETS[tc.preset]["context"], train_tokens)
        if tc.dropout == -1:
            tc.dropout = auto_dropout(passes, nucleotides)
        if tc.dropout_attn == -1:
            tc.dropout_attn = auto_dropout_attn(passes, nucleotides)


def nucleotide_window(preset: str, batch_size: int) -> tuple[int, int] | None:
    """(context, batch) for a run of `preset` on nucleotide data whose --context and --batch-size
    were both left to the run (`batch_size` the preset's): NUCLEOTIDE_CONTEXT and the batch that
    keeps the preset's tokens a step, or None where the preset keeps its own window."""
    full = PRESETS[preset]["context"]
    if preset not in NUCLEOTIDE_CONTEXT_PRESETS or full <= NUCLEOTIDE_CONTEXT:
        return None
    return NUCLEOTIDE_CONTEXT, batch_size * full // NUCLEOTIDE_CONTEXT


def eval_cadence(every: int, step_s: float, boundary_s: float) -> int:
    """The steps between validations of a time-budget run whose eval_every was left to the run:
    the preset's `every`, or more where one validation and save (boundary_s, measured at the plan
    step) would cost over VAL_SHARE of the training time between two (step_s a step), rounded up
    to EVAL_ROUND."""
    if not (step_s > 0 and boundary_s > 0 and math.isfinite(step_s) and math.isfinite(boundary_s)):
        return every
    need = boundary_s / (VAL_SHARE * step_s)
    return max(every, int(math.ceil(need / EVAL_ROUND)) * EVAL_ROUND)


def dropout_at_plan(tc, planned: int, context: int, train_tokens: int,
                    nucleotides: bool = False, timed: bool | None = None) -> tuple[float | None, float | None]:
    """A fresh time-budget run's dropouts once its plan is made: (dropout, attention dropout), each
    None where the run's settings gave it (or it is a fine-tune's, the parent's). timed: the run's
    steps were left to a time budget (default: tc.minutes > 0; also a budget run resumed with
    --steps before its plan, whose step count is the plan)."""
    if tc.parent or not (tc.minutes > 0 if timed is None else timed):
        return None, None
    passes = planned_passes(planned, tc.batch_size, context, train_tokens)
    return (auto_dropout(passes, nucleotides) if tc.dropout == -1 else None,
            auto_dropout_attn(passes, nucleotides) if tc.dropout_attn == -1 else None)
