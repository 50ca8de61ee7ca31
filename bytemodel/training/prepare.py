"""Setting up a run before its first step: the run directory, tokenizer, corpus and model config.

`prepare(tc)` resolves every "auto" setting (training/autoconf.py) on a copy of `tc` and returns
a `Run` whose settings are frozen from then on: what the run decides while it trains (the planned
step count, why it stopped) is the loop's state (training/loop.py), not a change to its settings.
On resume the settings come from the checkpoint (checked strictly: a checkpoint is a file anyone
can craft); only the HONOURED_ON_RESUME ones (validation.py) may be given anew. The device and
precision are the run's own unless given ("" = not given; `resumed_backend`): a fresh run records
its resolved device (never "auto"), so a resume without flags computes as the run did.

A fresh run also gets its data record (runinfo.run_data: the source, the resolved reader, the
byte values) and, before the freeze, a warmup that fits its steps (optim.fit_warmup); what it
changed is in Run.notes, for the loop to print.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from .. import checkpoint as ckpt
from ..config import PRESETS, ModelConfig, TrainConfig, preset as make_preset
from ..corpus import build_corpus, open_corpus
from ..errors import CheckpointError, ConfigError, SourceError, TokenizerError, named
from ..ops import resolve_device
from ..pairs import open_examples
from ..tokenizer import Tokenizer
from ..validation import stored_train_config
from . import distributed
from .autoconf import INVERT_SMALL_DATA, REVCOMP_SMALL_DATA, auto_context, auto_invert, auto_revcomp, auto_tile


@dataclass(frozen=True)
class Run:
    """What a run trains with. tc: the resolved settings (frozen); loaded: the checkpoint it
    resumes from (None for a fresh run)."""
    tc: TrainConfig
    run_dir: Path
    tok: Tokenizer
    corpus: object           # a Corpus (corpus.py) or an ExampleCorpus (pairs.py): the corpus protocol
    cfg: ModelConfig
    loaded: ckpt.Loaded | None = None
    data: dict | None = None     # the run's data record (runinfo.py); None on ranks other than 0 and
                                 # for a resumed run from before the record
    notes: tuple = ()            # lines about settings prepare() changed (a warmup scaled to the run)
    nucleotides: bool | None = None   # every training byte a nucleotide code (nucleotide_data); None: not
                                      # looked at (a resume, a fine-tune, ranks other than 0)
    eval_auto: bool = False      # a fresh run's eval_every was left to the run (0): a time budget sets its
                                 # cadence at the plan step (autoconf.eval_cadence); known on rank 0 only


def next_run_dir(source: str, root: Path = Path("runs")) -> Path:
    stem = Path(source.rstrip("/")).name.split(".")[0] or "run"
    for i in range(1, 10000):
        d = root / f"{stem}-{i}"
        if not d.exists():
            return d
    raise ConfigError(f"too many runs named {stem}-N under {root}")


def open_run_corpus(run_dir, examples: str = ""):
    """The corpus a run directory holds: its examples (fine-tuning with --pairs / --chat) or its
    plain token stream. Either answers the corpus protocol (corpus.py)."""
    return open_examples(run_dir) if examples else open_corpus(run_dir)


def _make_tokenizer(tc: TrainConfig, documents_fn) -> Tokenizer:
    if tc.tokenizer:
        if tc.merges:
            raise ConfigError(f"give either {named('--merges', 'merges')} (learn them) or {named('--tokenizer', 'tokenizer')} "
                              "(a tok.json), not both")
        return Tokenizer.load(tc.tokenizer)
    if tc.merges == 0:
        return Tokenizer()
    return Tokenizer.train(documents_fn(), tc.merges)


def prepare(tc: TrainConfig, resume: bool = False) -> Run:
    """Set up (or reopen) a run; `tc` itself is left as it was given."""
    tc = dataclasses.replace(tc)        # the draft that resolving fills in
    if resume:
        return _reopen(tc)
    tc.validate()
    tc.device = resolve_device(tc.device)   # recorded resolved: a resume computes where the run did
    if not tc.source:
        raise SourceError(f"no source given ({named('--source PATH', 'source=PATH')})")
    if tc.parent:  # fine-tuning: the parent's model and tokenizer, examples or plain data
        return _prepare_finetune(tc)
    return _prepare_fresh(tc)


def _reopen(given: TrainConfig) -> Run:
    """The run in given.out_dir, as its checkpoint left it; its corpus checked against the checkpoint."""
    if not given.out_dir:
        raise ConfigError(f"{named('--resume', 'resume=True')} needs the run directory ({named('--out DIR', 'out_dir=DIR')})")
    run_dir = Path(given.out_dir)
    loaded = ckpt.load(run_dir)
    if given.tokenizer:
        other = Tokenizer.load(given.tokenizer)
        if other.merges != loaded.tokenizer.merges:
            raise TokenizerError(f"tokenizer {given.tokenizer} does not match the checkpoint's "
                                 f"({other.n_merges} vs {loaded.tokenizer.n_merges} merges, or different ones)")
    stored = loaded.train.get("config")
    # --steps given to a run that trained for a time budget: the step count replaces the budget
    # (otherwise a budget already used up would stop the run again after one step)
    minutes = stored.get("minutes", 0) if isinstance(stored, dict) else 0
    replaced = bool(given.steps) and isinstance(minutes, (int, float)) and minutes > 0
    tc = stored_train_config(TrainConfig, loaded.train, str(loaded.path), out_dir=str(run_dir),
                             steps=given.steps or (stored.get("steps", 0) if isinstance(stored, dict) else 0),
                             distributed=given.distributed, shard_optimizer=given.shard_optimizer,
                             **({"minutes": 0.0} if replaced else {}),
                             **({} if isinstance(stored, dict) and "schedule" in stored
                                else {"schedule": "cosine"}))   # from before the setting: it ran cosine
    tc.device, tc.precision, notes = resumed_backend(tc.device, tc.precision, given.device, given.precision,
                                                     int(loaded.train["step"]))
    if replaced:
        notes += (f"note: --steps {given.steps} replaces the run's time budget of {minutes:g} min: "
                  f"it trains on to step {given.steps}",)
    tc.validate()
    corpus = open_run_corpus(run_dir, tc.examples)
    if corpus.sha256 != loaded.train.get("corpus_sha256") \
            or loaded.train.get("corpus_split", corpus.split) != corpus.split \
            or loaded.train.get("n_bytes", corpus.n_bytes) != corpus.n_bytes:   # corpus.json's split and size too
        raise CheckpointError(f"the corpus in {run_dir} is not the one this checkpoint was trained on "
                              f"(its tokens, split or size differ)")
    corpus.verify(loaded.cfg.vocab_size, run_dir)    # its files hashed again
    cfg = loaded.cfg
    if len(corpus.train) <= cfg.context or len(corpus.val) < 2:
        raise SourceError(f"corpus.json in {run_dir} is damaged: its split leaves no room for a "
                          f"window of context {cfg.context}")
    from ..runinfo import RunData
    RunData.of(loaded.train, str(loaded.path))      # a crafted data record is refused, not carried on
    return Run(tc.freeze(), run_dir, loaded.tokenizer, corpus, cfg, loaded, loaded.train.get("data"), notes)


def resumed_backend(run_device: str, run_precision: str, device: str, precision: str,
                    step: int) -> tuple[str, str, tuple]:
    """The device and precision a resumed run trains with -> (device, precision, note lines).

    run_*: what the checkpoint records (the device resolved at the run's start; "auto" or the
    default "cpu" in checkpoints from before that). device / precision: given with --resume, ""
    when not. Not given: the run's own, so the resume is bit-identical (a GPU run with no GPU here,
    or a fp16/bf16 run resumed on the CPU, is refused: say which flags continue it). Given and
    different: honoured, with one note saying the run is no longer bit-identical from `step` on."""
    from ..ops import cuda_available
    from .autoconf import auto_precision
    if not device and run_device == "cuda" and not cuda_available():
        raise ConfigError(f"the run trained on cuda ({run_precision}) and there is no GPU here: give "
                          + named('--device cpu --precision fp32', 'device="cpu", precision="fp32"')
                          + " to continue it on the CPU (not bit-identical)")
    dev = resolve_device(device or run_device)
    prec = precision or run_precision
    if prec == "auto":
        prec = auto_precision(dev)
    if not precision and dev == "cpu" and prec != "fp32":
        raise ConfigError(f"the run trained in {run_precision}; the CPU computes in fp32 only: give "
                          + named('--precision fp32', 'precision="fp32"') + " to continue it in fp32 (not bit-identical)")
    notes = []
    if device and run_device in ("cpu", "cuda") and dev != run_device:
        notes.append(f"note: --device {device}: the run trained on {run_device} and continues on {dev} "
                     f"from step {step}: not bit-identical to a run kept on {run_device}")
    if precision and run_precision != "auto" and prec != run_precision:
        notes.append(f"note: --precision {precision}: the run trained in {run_precision} and continues in "
                     f"{prec} from step {step}: not bit-identical to a run kept in {run_precision}")
    return dev, prec, tuple(notes)


def _finish(tc: TrainConfig, run_dir: Path, tok: Tokenizer, corpus, cfg: ModelConfig) -> Run:
    """A fresh run's Run: its warmup fitted to its steps (a time budget plans them later), its
    data record, its settings frozen."""
    from ..runinfo import run_data
    from .optim import fit_warmup
    note = "" if tc.minutes > 0 else fit_warmup(tc)
    return Run(tc.freeze(), run_dir, tok, corpus, cfg, None, run_data(tc, corpus, tok), (note,) if note else ())


def _prepare_finetune(tc: TrainConfig) -> Run:
    from ..lineage import prepare_finetune
    from .autoconf import resolve
    run_dir, tok, corpus, cfg = prepare_finetune(tc, next_run_dir)   # fills in parent, context, out_dir
    if tc.preset == "auto":   # the auto settings (batch, validation interval) of the parent's size
        tc.preset = next((n for n, p in PRESETS.items() if p["d_model"] == cfg.d_model), "tiny")
    resolve(tc, resolve_device(tc.device))
    tc.validate()
    given = {f: getattr(tc, f) for f in ("dropout", "dropout_attn") if getattr(tc, f) >= 0}
    if given:   # given: the fine-tune's own; otherwise the parent's
        cfg = ModelConfig.from_dict({**cfg.to_dict(), **given})
    return _finish(tc, run_dir, tok, corpus, cfg)


def _prepare_fresh(tc: TrainConfig) -> Run:
    from ..readers import stream_documents
    from .autoconf import resolve
    from .runner import cores
    if not tc.out_dir:
        tc.out_dir = str(next_run_dir(tc.source))
    run_dir = Path(tc.out_dir)
    ckpt.check_new_run(run_dir)
    ctx0 = tc.context or PRESETS["tiny" if tc.preset == "auto" else tc.preset]["context"]
    eval_auto = tc.eval_every == 0           # before resolve gives it the preset's
    tile_note = _tile_images(tc)
    # merges learn from streamed pieces: no document held whole
    tok = _make_tokenizer(tc, lambda: stream_documents(tc.source, tc.reader or None))
    # streamed in bounded pieces, whatever the file size (with merges too: encode_chunks)
    corpus = build_corpus(None, tok, run_dir, tc.val_fraction, ctx0,
                          pieces=stream_documents(tc.source, tc.reader or None))
    notes = (tile_note,) if tile_note else ()
    dna = nucleotide_data(corpus, tok)   # one pass: the reverse strand's rule and --dropout auto's
    reader, auto = _augmenting_reader(tc, corpus, tok, dna)
    if reader is not None:                   # the reader adds copies of training documents
        from .augment import add_training_copies
        corpus = add_training_copies(run_dir, corpus, tok, reader.training_copies)
        if auto and reader.name == "fasta":
            notes += ("reverse strand: each training record's reverse complement added (fasta revcomp auto: "
                     f"a GPU run on at most {REVCOMP_SMALL_DATA // 1_000_000} MB of nucleotides; "
                     "--reader fasta:revcomp=no turns it off)",)
        elif auto:
            notes += ("inverted polarity: each training clip added again with every sample negated (audio "
                      f"invert auto: a GPU run on at most {INVERT_SMALL_DATA // 1_000_000} MB of audio; "
                      "--reader audio:invert=no turns it off)",)
    window_given = (tc.context, tc.batch_size)
    resolve(tc, resolve_device(tc.device), _train_bytes(corpus), cores(), train_tokens=len(corpus.train),
            nucleotides=dna)
    if window_given == (0, 0) and tc.context not in (0, PRESETS[tc.preset]["context"]):
        full = PRESETS[tc.preset]["context"]
        notes += (f"nucleotides: {tc.preset} reads windows of {tc.context} tokens, {tc.batch_size} a step (its "
                  f"tokens a step; --context {full} --batch-size {tc.batch_size * tc.context // full} for its own)",)
    tc.validate()
    ctx = tc.context or PRESETS[tc.preset]["context"]
    # a time budget's auto dropouts (still -1) are 0 until its plan step decides them (training/loop.py)
    cfg = make_preset(tc.preset, tok.vocab_size, **{**tc.model, "context": ctx, "dropout": max(tc.dropout, 0.0),
                                                    "dropout_attn": max(tc.dropout_attn, 0.0)})
    run = _finish(tc, run_dir, tok, corpus, cfg)
    return dataclasses.replace(run, notes=notes + run.notes, nucleotides=dna, eval_auto=eval_auto)


def _tile_images(tc: TrainConfig) -> str:
    """Cut the images into tiles when their rows outrun the context: a source that is all images
    (given as --reader image[:...] without tile, or detected) whose widest row is longer than the
    run's context (autoconf.auto_tile) gets tc.reader = image:tile=N, recorded with the run like
    any reader. Returns the note that says so, or ''."""
    from ..readers import get_reader, source_files
    from ..readers.image import ImageReader
    reader = None if tc.examples else _reader_leaving(tc, ImageReader, "tile")
    if reader is None:
        return ""
    files = source_files(tc.source)
    from .runner import cores
    auto = auto_context(resolve_device(tc.device), cores())
    context = tc.context or (auto if tc.preset == "auto" else PRESETS[tc.preset]["context"])
    for f in files:                     # the first image whose rows outrun the context decides
        w, c = reader.row_shape(f)
        n = auto_tile(w, c, context)
        if n:
            break
    else:
        return ""
    row = w * c
    spec = reader.spec
    tc.reader = get_reader(f"{spec}{',' if ':' in spec else ':'}tile={n}").spec
    return (f"images in {n} x {n} tiles (image tile auto: {Path(f).name}'s rows of {row:,} bytes outrun the "
            f"{context:,}-byte context; --reader image:tile=0 keeps whole rows)")


def _reader_leaving(tc: TrainConfig, cls, option: str):
    """The run's reader when it is a `cls` reader that leaves `option` unset: the one given
    (--reader), or, none given, a `cls` reader with its defaults when detection picks `cls` for
    every file of the source; else None (another reader, the option given, a mixed folder)."""
    from ..readers import detect, get_reader, source_files
    if tc.reader:
        reader = get_reader(tc.reader)
        return reader if isinstance(reader, cls) and option not in reader.options else None
    files = source_files(tc.source)
    return cls() if files and all(isinstance(detect(f), cls) for f in files) else None


def _train_bytes(corpus) -> int:
    """The training part's bytes, estimated from its share of the tokens."""
    return int(len(corpus.train) * corpus.n_bytes / max(len(corpus.tokens), 1))


def _augmenting_reader(tc: TrainConfig, corpus, tok: Tokenizer, dna: bool | None = None):
    """(the reader whose training copies this run adds (fasta:revcomp, audio:invert) or None,
    whether auto chose it).

    Given (--reader fasta:revcomp=yes), as asked. Left unset, on a source that is all FASTA
    (given as --reader fasta[:...] or detected), the reverse strand is added when
    autoconf.auto_revcomp says so for the run's device and training bytes, and every byte of the
    data is a nucleotide code (a protein FASTA has no reverse complement); on a source that is all
    audio, the inverted clips when autoconf.auto_invert says so."""
    from ..readers import get_reader
    from ..readers.audio import AudioReader
    from ..readers.fasta import FastaReader
    given = get_reader(tc.reader) if tc.reader else None
    if given is not None and given.augments:
        return given, False
    audio = _reader_leaving(tc, AudioReader, "invert")
    if audio is not None:
        ok = auto_invert(_train_bytes(corpus), tc.device)
        return (AudioReader(**{**audio.options, "invert": True}), True) if ok else (None, False)
    reader = _reader_leaving(tc, FastaReader, "revcomp")
    if reader is None or not auto_revcomp(_train_bytes(corpus), tc.device):
        return None, False
    if not (nucleotide_data(corpus, tok) if dna is None else dna):
        return None, False
    return FastaReader(**{**reader.options, "revcomp": True}), True


def nucleotide_data(corpus, tok: Tokenizer) -> bool:
    """Whether every byte of the corpus's training part is a nucleotide code (readers/fasta.py):
    DNA or RNA read by any reader, its reverse strand included. It decides the reverse strand's
    default (above) and when `--dropout auto` drops (autoconf.dropout_passes)."""
    from ..readers.fasta import NUCLEOTIDE_CODES
    from ..runinfo import byte_values
    return set(byte_values(corpus.train, tok)) <= NUCLEOTIDE_CODES


def _open_prepared(d: dict) -> Run:
    """A rank other than 0 opens the run rank 0 has just prepared (same settings, corpus, model)."""
    tc = TrainConfig(**d["tc"])
    run_dir = Path(tc.out_dir)
    corpus = open_run_corpus(run_dir, tc.examples)
    return Run(tc.freeze(), run_dir, Tokenizer.from_dict(d["tok"]), corpus, ModelConfig.from_dict(d["cfg"]))


def prepare_ranks(world, tc: TrainConfig, resume: bool) -> Run:
    """prepare() on rank 0 (it may build the corpus); the other ranks then open the same run."""
    if resume:
        return distributed.on_rank0_first(world, lambda: prepare(tc, True), lambda _: prepare(tc, True))
    box = {}

    def first():
        box["run"] = run = prepare(tc, False)
        return {"tc": dataclasses.asdict(run.tc), "tok": run.tok.to_dict(), "cfg": run.cfg.to_dict()}
    d = distributed.on_rank0_first(world, first, _open_prepared)
    return box["run"] if world.main else d
