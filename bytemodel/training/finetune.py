"""Fine-tuning as a user runs it: a training run that starts from another run (see lineage.py).

    bytemodel.finetune("runs/jargon-1", "qa.jsonl", "runs/qa", examples="pairs", steps=300)

and the parent's figure on the fine-tune's own held-out data (the 'before' beside the 'after').
"""
from __future__ import annotations

from .. import checkpoint as ckpt
from ..errors import ConfigError, named
from ..lineage import DEFAULTS, parent_weights


def finetune(parent, source, out_dir=None, *, examples: str = "", val_source: str = "", resume: bool = False,
             progress: bool = False, log=None, stop_at: int | None = None, **settings):
    """Fine-tune the run (or checkpoint) `parent` on `source`: plain data, or with examples="pairs" /
    "chat" a JSONL file of examples. Settings are TrainConfig fields (steps, lr, batch_size, ...);
    steps, lr and warmup default to DEFAULTS. resume=True continues the fine-tune in out_dir.
    Returns a TrainResult."""
    import dataclasses
    from ..config import TrainConfig, train_settings
    from .loop import train as _train
    known = {f.name for f in dataclasses.fields(TrainConfig)}
    bad = set(settings) - known
    bad |= {"parent", "examples", "val_source", "source", "out_dir", "preset", "model", "context"} & set(settings)
    if bad:
        raise ConfigError(f"setting(s) not for a fine-tune: {', '.join(sorted(bad))}")
    given = None
    settings = train_settings(settings)    # wrong types: one ConfigError each
    if resume:   # 0 / "": the run's own step count, device and precision
        given = dict(settings)   # those the run keeps its own of are named in a note (as train's --resume)
        settings = {"steps": 0, "device": "", "precision": "", **settings}
        tc = TrainConfig(out_dir=str(out_dir) if out_dir else "", **settings)
    else:
        if not parent:
            raise ConfigError(f"a fine-tune needs the run to start from ({named('--from RUN', 'finetune(parent, ...)')})")
        settings = {**DEFAULTS, **settings}
        tc = TrainConfig(source=str(source) if source else "", out_dir=str(out_dir) if out_dir else "",
                         parent=str(parent), examples=examples, val_source=str(val_source or ""), **settings)
    return _train(tc, resume=resume, progress=progress, log=log or (lambda *a: None), stop_at=stop_at,
                  given=given)


def parent_val_bpb(run_dir, device: str | None = None) -> float:
    """The parent's bits/byte on the fine-tune's own validation data (the same windows, the same
    counted targets): the 'before' beside the run's 'after'."""
    from ..model import Model
    from ..ops import get_backend
    from ..ops.scorer import Scorer
    from .prepare import open_run_corpus
    from ..config import TrainConfig
    loaded = ckpt.load(run_dir)
    tc = TrainConfig(**loaded.train["config"])
    if not tc.parent:
        raise ConfigError(f"{run_dir} is not a fine-tune")
    device = device or tc.device
    ops = get_backend(device, tc.precision if device != "cpu" else "fp32")
    model = Model(loaded.cfg, ops)
    model.load_flat(parent_weights(tc, loaded.cfg))
    scorer = Scorer(model, workers=tc.workers or None)
    corpus = open_run_corpus(run_dir, tc.examples)
    return corpus.score(scorer.nll, loaded.tokenizer, loaded.cfg.context, tc.eval_tokens, scorer.batch)[0]
