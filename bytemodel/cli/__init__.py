"""The `bytemodel` command: a thin layer over the Python API.

This module holds the commands that train and use a model (train, generate, score, gradcheck,
info); readers.py, data.py, tokenizer.py, hf.py and finetune.py (finetune, chat) beside it add theirs; errors.py turns user errors
into one line. `python -m bytemodel.cli` runs the same app (__main__.py).

User errors (BytemodelError) print as one line on stderr and exit with status 2; a failed check
exits 1; an interrupted run exits 130 after saving.
"""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Optional

import typer

from ..config import TrainConfig as D  # the training defaults, written once (in TrainConfig)
from ..errors import ConfigError, exit_on_signal
from .memory import roomy_malloc
from . import compress as compress_cmd, data as data_cmd, finetune as finetune_cmd, hf as hf_cmd, plot as plot_cmd, readers as readers_cmd, tokenizer as tokenizer_cmd
from .errors import a_folder, check_out, either, need_stdout, read_as_run, run_app, user_errors
from .helptext import tidy as tidy_help

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Byte-level transformers for any 8-bit stream: train, generate, score, check.")


@app.command()
def train(
    ctx: typer.Context,
    source_arg: Optional[str] = typer.Argument(None, metavar="SOURCE", show_default=False,
                                               help="The same as --source (either, not two)."),
    source: Optional[str] = typer.Option(None, "--source", "-s", help="File or directory to learn from."),
    preset: str = typer.Option(D.preset, help="Model size: tiny, small, base, or auto (by data size and device; docs/ARCHITECTURE.md)."),
    steps: Optional[int] = typer.Option(None, help=f"Optimizer steps (default {D.steps}; on --resume, the run's own count; "
                                        "a different count extends the schedule: the rate goes on from where it was, "
                                        "by cosine decay to the floor at the new count, no new warmup)."),
    batch_size: int = typer.Option(D.batch_size, "--batch-size", "-b", help="Windows per step (0: the preset's; tiny 16, small/base 32)."),
    context: int = typer.Option(D.context, help="Window length in tokens (0: the preset's)."),
    lr: float = typer.Option(D.lr, help="Peak learning rate, warmup then cosine decay (0: the preset's; tiny 2e-3, small 1e-3, base 6e-4)."),
    warmup: int = typer.Option(D.warmup, help="Warmup steps (-1: the preset's; one not shorter than the run is scaled to a tenth of it, with a note)."),
    patience: int = typer.Option(D.patience, help=f"Stop after this many validations without a new best (default {D.patience}; 0: never); with the plateau schedule only once its rate is at the floor."),
    schedule: str = typer.Option(D.schedule, help="Learning rate after the warmup: plateau (the default: cosine to the planned end, but at each plateau of validation the run goes back to its best weights and halves the rate, stopping by patience only once the rate is at its floor) or cosine (no cuts)."),
    minutes: float = typer.Option(D.minutes, help="Time budget: plan the steps to fit it, from the measured step time (0: use --steps)."),
    weight_decay: float = typer.Option(D.weight_decay, "--weight-decay", help="AdamW decoupled weight decay."),
    dropout: str = typer.Option("auto", help="Dropout on the embedding and every residual branch while training: "
                                "P in [0, 0.9], or auto (0.2 for a run that plans at least 5 passes over its training data, "
                                "20 where it is all nucleotide codes, else 0; a time budget decides at its plan step; "
                                "benchmarks/README.md)."),
    dropout_attn: str = typer.Option("auto", "--dropout-attn", help="Dropout on the attention probabilities while "
                                     "training: P in [0, 0.9], or auto (0.2 where --dropout auto drops, else 0)."),
    grad_clip: float = typer.Option(D.grad_clip, "--grad-clip", help="Global gradient-norm clip (0: off)."),
    seed: int = typer.Option(D.seed, help="Seed for the initial weights and the batch sampler."),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="Run directory (default: runs/<source>-N)."),
    resume: bool = typer.Option(False, help="Continue the run in --out exactly where it stopped (--steps N to go on to N)."),
    device: Optional[str] = typer.Option(None, help=f"cpu, cuda or auto (default {D.device}; on --resume, the run's own)."),
    precision: Optional[str] = typer.Option(None, help="auto (the default: fp32 on the CPU, bf16 on GPUs of compute capability >= 8.0, else fp16), fp32, fp16 or bf16. On --resume the run's own (a resume is bit-identical only in it); another given there is used from that step on, with a note."),
    reader: str = typer.Option(D.reader, help="Reader name (default: detected from the file)."),
    merges: int = typer.Option(D.merges, help="BPE merges to learn from the source (0: plain bytes)."),
    tokenizer: str = typer.Option(D.tokenizer, help="A tok.json (from `bytemodel tokenizer train`) to use instead of --merges."),
    workers: int = typer.Option(D.workers, help="CPU threads, each training a slice of the batch (0: one per core)."),
    distributed: str = typer.Option(D.distributed, help="auto: data parallel over MPI ranks when started by "
                                    "mpiexec or srun; mpi: always (one rank without a launcher too); off."),
    shard_optimizer: bool = typer.Option(D.shard_optimizer, "--shard-optimizer",
                                         help="ZeRO-1 over MPI ranks: each keeps 1/N of the AdamW moments."),
    eval_every: int = typer.Option(D.eval_every, "--eval-every", help="Steps between validation + checkpoint (0: the preset's; tiny 100, small/base 250; with --minutes, a run planned below the passes at which --dropout auto drops validates at most 5 percent of its training time)."),
    eval_tokens: int = typer.Option(D.eval_tokens, "--eval-tokens", help="Validation tokens scored each time (0: at most 2097152 evenly spread on a GPU, 131072 on the CPU)."),
    val_fraction: float = typer.Option(D.val_fraction, "--val-fraction", help="Tail of the data held out."),
    d_model: Optional[int] = typer.Option(None, "--d-model", help="Override the preset's width."),
    n_layers: Optional[int] = typer.Option(None, "--n-layers", help="Override the preset's depth."),
    n_heads: Optional[int] = typer.Option(None, "--n-heads", help="Override the number of heads."),
    n_kv_heads: Optional[int] = typer.Option(None, "--n-kv-heads", help="Key/value heads (grouped-query)."),
    d_ff: Optional[int] = typer.Option(None, "--d-ff", help="Override the SwiGLU width."),
    rope_theta: Optional[float] = typer.Option(None, "--rope-theta", help="RoPE base."),
    mtp: Optional[int] = typer.Option(None, "--mtp",
                                      help="Train K-1 multi-token heads predicting t+2..t+K (1: none)."),
    mtp_weight: Optional[float] = typer.Option(None, "--mtp-weight", help="The heads' auxiliary loss weight (0.3)."),
    mtp_design: Optional[str] = typer.Option(None, "--mtp-design", help="sequential (default) or independent heads."),
    tie_embeddings: Optional[bool] = typer.Option(None, "--tie-embeddings/--untie-embeddings",
                                                  help="Share the embedding and LM head."),
    baseline: bool = typer.Option(True, help="At the end, print zstd -19 and xz -9e bits/byte on the same data: the "
                                  "held-out tail (given the rest first) and the whole stream."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bar."),
):
    """Train a byte-level model on any file or directory.

    Keeps the best weights (lowest validation) in best.safetensors beside the resume checkpoint,
    stops early when validation stops improving, and writes loss.png in the run directory.
    Example: bytemodel train --source genome.fa --steps 1000   (or: bytemodel train genome.fa ...)
    Example: bytemodel train --source genome.fa --device cuda --minutes 5
    Example: bytemodel train --resume --out runs/genome-1 --steps 2000

    The run records the reader that read its data (given, or detected: FASTA for .fa.gz) and the
    byte values the data holds; generate, score, eval and compress use them.

    On a cluster: mpiexec -n 8 bytemodel train --source corpus.txt --device cuda --batch-size 256
    (--batch-size is the whole batch; each rank trains its share).
    """
    from .. import train as api_train
    with user_errors():
        source = either(source_arg, source, "sources", "--source")
        if not resume and not source:
            raise ConfigError("give the data to learn from: bytemodel train PATH (or --source PATH; a file or "
                              "directory), or --resume --out RUN_DIR")
        overrides = {k: v for k, v in dict(d_model=d_model, n_layers=n_layers, n_heads=n_heads,
                                             n_kv_heads=n_kv_heads, d_ff=d_ff, rope_theta=rope_theta,
                                             tie_embeddings=tie_embeddings, mtp=mtp, mtp_weight=mtp_weight,
                                             mtp_design=mtp_design).items() if v is not None}
        drop = parse_dropout(dropout)
        if steps is not None and steps <= 0:
            raise ConfigError(f"steps must be positive, got {steps}")
        settings = dict(preset=preset, steps=steps or (0 if resume else D.steps), batch_size=batch_size,
                        context=context, lr=lr, warmup=warmup, weight_decay=weight_decay, grad_clip=grad_clip,
                        dropout=drop, dropout_attn=parse_dropout(dropout_attn, "--dropout-attn"),
                        seed=seed, device=device or ("" if resume else D.device),
                        precision=precision or ("" if resume else D.precision), reader=reader, merges=merges, tokenizer=tokenizer,
                        workers=workers, distributed=distributed, shard_optimizer=shard_optimizer,
                        patience=patience, schedule=schedule, minutes=minutes, baseline=baseline and not resume,
                        eval_every=eval_every, eval_tokens=eval_tokens, val_fraction=val_fraction,
                        model=overrides)
        if resume:   # only what was given on the command line: the run's own settings win, and say so
            from ..validation import HONOURED_ON_RESUME
            given = lambda k: ctx.get_parameter_source(k).name == "COMMANDLINE"  # noqa: E731
            settings = {k: v for k, v in settings.items()
                        if k in HONOURED_ON_RESUME or (k != "model" and given(k))}
            if overrides:
                settings["model"] = overrides
        res = api_train(source or "", a_folder(out, "--out"), resume=resume, progress=not quiet, log=typer.echo, **settings)
        if not res.main:            # MPI ranks other than 0: rank 0 reports
            raise typer.Exit(130 if res.interrupted else 0)
        _summary(res)
        if res.interrupted:
            raise typer.Exit(130)


def parse_dropout(text: str, flag: str = "--dropout") -> float:
    """--dropout, --dropout-attn: 'auto' -> -1 (TrainConfig's auto), else a number (checked by TrainConfig)."""
    if text.strip().lower() == "auto":
        return -1.0
    try:
        return float(text)
    except ValueError:
        raise ConfigError(f"{flag} must be a number in [0, 0.9] or auto, got {text!r}") from None


def _summary(res) -> None:
    """The end of a run: why it stopped, the best and the last weights with their steps, the compressors."""
    typer.echo(res.stop_reason)
    if res.best_checkpoint is not None:
        from ..training.progress import plus_minus
        se = plus_minus(res.val_se)
        typer.echo(f"best: step {res.best_step}, validation {res.val_bpb:.4f}{se} bits/byte: {res.best_checkpoint} "
                   f"(generate, score, info use it; --last for the latest)")
    last = f"validation {res.last_val_bpb:.4f} bits/byte" if res.last_val_bpb is not None else "not validated"
    typer.echo(f"last: step {res.step}, {last}: {res.checkpoint} (resume from here with --resume)")
    b = res.baselines
    if b and res.val_bpb is not None:
        f = lambda v: "n/a (zstandard missing)" if v is None else f"{v:.4f}"  # noqa: E731
        scored = _tail_as_scored(res)
        model = (f"{scored:.4f} (read as `score` reads a file; {res.val_bpb:.4f} at validation)"
                 if scored is not None else f"{res.val_bpb:.4f}")
        typer.echo(f"held-out tail, bits/byte: model {model} | zstd -19 {f(b.get('zstd19_tail'))} | "
                   f"xz -9e {f(b.get('xz9_tail'))} (compressors given the rest of the data first)")
        typer.echo(f"whole stream ({b['bytes']:,} bytes), bits/byte: zstd -19 {f(b.get('zstd19'))} | "
                   f"xz -9e {f(b.get('xz9'))}")
    if (res.run_dir / "loss.png").exists():
        typer.echo(f"loss curve: {res.run_dir / 'loss.png'}")


def _tail_as_scored(res) -> float | None:
    """The best weights' bits/byte on the held-out tail read as `score` reads a file
    (LanguageModel.score_tail), on the run's device and precision, so that the figure beside the
    compressors' is the one `score`, `eval` and `compress` see (the run's validations read
    non-overlapping windows: at 256 tokens on DNA 0.045 bits/byte more; benchmarks/README.md, "A
    shorter window on nucleotides"). None for a fine-tune, or where it cannot be scored: the
    validation figure is printed alone then. The run is saved either way: a failure here (a
    bytemodel or OS error, no memory, or a bug) leaves one `note:` line that names it, never a
    traceback and never a failed command."""
    try:
        from .. import LanguageModel, checkpoint as ckpt
        from ..ops import resolve_device
        if res.best_checkpoint is None:
            return None
        loaded = ckpt.load(res.best_checkpoint)
        conf = loaded.train.get("config") or {}
        if conf.get("parent") or conf.get("examples"):
            return None
        lm = LanguageModel(loaded, resolve_device(conf.get("device", "cpu")), conf.get("precision", "fp32"))
        r = lm.score_tail(res.run_dir)
        return r["bits_per_byte"] if r["bytes"] else None
    except Exception as e:   # the run is saved and reported either way; this figure is an extra
        msg = str(e).splitlines()[0] if str(e) else ""
        typer.echo(f"note: the held-out tail could not be scored as `score` reads it ({type(e).__name__}"
                   f"{': ' + msg if msg else ''}); the validation figure is shown alone", err=True)
        return None


def _read_prompt(prompt: str) -> bytes:
    if prompt.startswith("@"):
        from ..fileguard import regular_file
        p = regular_file(prompt[1:], "prompt file", ConfigError)
        try:
            return p.read_bytes()
        except OSError as e:
            raise ConfigError(f"cannot read prompt file {p}: {e.strerror}") from None
    return os.fsencode(prompt)   # the bytes as given: a shell's $'AC\xffGT' arrives surrogate-escaped


@app.command()
def generate(
    n_bytes: int = typer.Option(4096, "--bytes", "-n", help="How many bytes to produce."),
    checkpoint: Optional[Path] = typer.Option(None, "--checkpoint", "-c",
                                              help="A run directory (its best weights; --last for the latest) or a checkpoint file (default: the latest run under ./runs)."),
    prompt: str = typer.Option("", "--prompt", "-p", help="Text to continue, or @FILE for raw bytes."),
    prompt_file: Optional[Path] = typer.Option(None, "--prompt-file",
                                               help="A file of the run's kind (image, audio, FASTA...) decoded "
                                                    "by its reader, to continue."),
    temperature: float = typer.Option(1.0, "--temperature", "-t", help="0 = greedy."),
    top_k: int = typer.Option(0, "--top-k", help="Keep the k likeliest ids (0: off)."),
    top_p: float = typer.Option(1.0, "--top-p", help="Nucleus sampling mass (1: off)."),
    seed: int = typer.Option(0, help="Sampling seed: same seed, same output."),
    one_document: bool = typer.Option(False, "--one-document",
                                      help="Stop early where the model ends the document (e.g. one FASTA record)."),
    out: Optional[Path] = typer.Option(None, "--out", "-o",
                                       help="Write prompt + generated bytes to this file, as its format (- for stdout)."),
    fmt: str = typer.Option("", "--format", "-f",
                            help="Output format: png, wav, fa, zst, txt, raw or a reader spec "
                                 "(default: from --out's extension, else the run's reader)."),
    device: str = typer.Option("cpu", help="cpu, cuda or auto."),
    speculative: bool = typer.Option(False, "--speculative",
                                     help="Draft with the model's multi-token heads (--mtp runs) and verify "
                                          "in blocks: the same distribution, fewer passes; reports the "
                                          "acceptance rate and bytes/s on stderr."),
    precision: str = typer.Option("fp32", help="On cuda: fp32 (the CPU's bytes), fp16 or bf16 (faster)."),
    samples: int = typer.Option(1, "--samples", "-N", help="Draw this many samples in one batched pass."),
    force: bool = typer.Option(False, "--force", help="Replace an existing --out file (and a sample's, with --samples)."),
    last: bool = typer.Option(False, "--last", help="Use the run's latest weights, not its best."),
    any_byte: bool = typer.Option(False, "--any-byte", help="Sample any byte value, not only those the run's "
                                  "data holds (the default: a DNA model writes only its genome's letters)."),
):
    """Generate bytes from a trained model (KV cache).

    To stdout: the generated bytes only. With --out: the prompt followed by the generated bytes,
    written as a valid file of the format (so a header given in the prompt, such as an image's
    size, reaches the writer). With --samples N: to stdout the samples one after another, each
    followed by a newline; with --out FILE one file per sample, FILE's name with .0, .1, ...
    before its extension. To a terminal the output ends with a newline.

    Only the byte values the run's data holds are sampled (--any-byte for all). Files are written
    by the run's reader (recorded when it trained); --format must agree with --out's extension
    (mp3 for x.mp3), else nothing is written.
    Example: bytemodel generate --bytes 4096 --out sample.fa
    """
    from .. import load
    with user_errors():
        if n_bytes < 0:
            raise ConfigError(f"bytes must be >= 0, got {n_bytes}")
        if samples < 1:
            raise ConfigError(f"samples must be >= 1, got {samples}")
        if samples > 1 and speculative:
            raise ConfigError("--speculative draws one sample at a time (leave out --samples)")
        if prompt and prompt_file is not None:
            raise ConfigError("give --prompt or --prompt-file, not both")
        if out is not None:   # before any work: `generate -o data.fa` replaced the data it was trained on
            for path in ([out] if samples == 1 else [_sample_path(out, i) for i in range(samples)]):
                check_out(path, force)
        lm = load(checkpoint, device=device, precision=precision, last=last)
        if speculative and lm.cfg.mtp < 2:
            raise ConfigError("--speculative needs a model trained with multi-token heads (train with --mtp 2 or more)")
        from ..decode.generate import on_device
        if speculative and on_device(lm.model, lm.tokenizer.vocab_size) is not None:
            # drafting and verifying run the cached forward launched op by op, the plain sampler the
            # on-device decoder: 6-20x faster on an H100 (benchmarks/README.md, "--speculative on the GPU")
            typer.echo("note: on a GPU the on-device decoder is faster than --speculative (its verify pass "
                       "runs op by op): sampling with it instead, from the same distribution", err=True)
            speculative = False
        _note_old_run(lm)
        data_prompt = _read_prompt(prompt) if prompt_file is None else _decode_prompt(prompt_file, lm)
        stats, t0 = None, time.perf_counter()
        if speculative:
            from ..decode.speculative import SpecStats
            stats = SpecStats()

        def report(n):
            if stats is not None:
                dt = time.perf_counter() - t0
                typer.echo(f"speculative: {stats.acceptance:.1%} of {stats.drafted:,} drafts accepted, "
                           f"{stats.tokens_per_step:.2f} tokens per pass, {n / dt:,.0f} bytes/s", err=True)
        if samples > 1:
            _generate_samples(lm, n_bytes, data_prompt, temperature, top_k, top_p, seed, one_document,
                              samples, out, fmt, any_byte)
            return
        if out is None and not fmt:
            if sys.stdout is None:   # started with stdout closed (>&-)
                raise ConfigError("stdout is closed: give --out FILE to write the bytes to a file")
            stream = sys.stdout.buffer
            data = lm.generate(n_bytes, data_prompt, temperature, top_k, top_p, seed, one_document,
                               on_bytes=lambda b: (stream.write(b), stream.flush()),
                               speculative=speculative, stats=stats, any_byte=any_byte)
            if _to_terminal() and not data.endswith(b"\n"):   # the shell's prompt on its own line
                stream.write(b"\n")
                stream.flush()
            report(len(data))
            _note_short([data], n_bytes, one_document)
            return
        if out is None:
            raise ConfigError("--format needs --out FILE")
        from ..readers import output_reader
        output_reader(out, fmt or None)   # a --format that contradicts the name: refused before generating
        data = lm.generate(n_bytes, data_prompt, temperature, top_k, top_p, seed, one_document,
                           speculative=speculative, stats=stats, any_byte=any_byte)
        report(len(data))
        _note_short([data], n_bytes, one_document)
        lm.write(data_prompt + data, out, fmt)
        typer.echo(f"wrote {len(data):,} generated bytes (after a {len(data_prompt):,}-byte prompt) to {out}",
                   err=True)


def _note_short(datas, n_bytes: int, one_document: bool) -> None:
    """One line for samples that ended short without --one-document: the model drew nothing but
    ids that give no bytes (<doc>) for decode.generate.MAX_EMPTY_DRAWS draws in a row."""
    short = [len(d) for d in datas if len(d) < n_bytes]
    if short and not one_document:
        from ..decode.generate import MAX_EMPTY_DRAWS
        typer.echo(f"note: {len(short)} of {len(datas)} sample(s) stopped short ({min(short):,} of {n_bytes:,} "
                   f"bytes at the least): the model drew {MAX_EMPTY_DRAWS} ids in a row that give no bytes "
                   f"(<doc>); train longer, or sample with a temperature", err=True)


def _to_terminal() -> bool:
    return sys.stdout.isatty()


def _note_old_run(lm) -> None:
    """One line on stderr for a run trained before runs recorded their reader and byte values."""
    note = lm.data.note(lm.path)
    if note:
        typer.echo(note, err=True)


def _generate_samples(lm, n_bytes, data_prompt, temperature, top_k, top_p, seed, one_document, samples,
                      out, fmt, any_byte) -> None:
    from ..fileguard import is_stdio
    if out is not None and is_stdio(out):    # it made files named -.0, -.1, ...
        raise ConfigError("--samples writes a file per sample: give --out FILE (or leave it out for stdout)")
    if out is not None:
        from ..readers import output_reader
        output_reader(out, fmt or None)
    datas = lm.generate(n_bytes, data_prompt, temperature, top_k, top_p, seed, one_document, samples=samples,
                        any_byte=any_byte)
    _note_short(datas, n_bytes, one_document)
    if out is None:
        if fmt:
            raise ConfigError("--format needs --out FILE")
        stream = sys.stdout.buffer
        for d in datas:
            stream.write(d + b"\n")
        stream.flush()
        return
    for i, d in enumerate(datas):
        path = _sample_path(out, i)
        lm.write(data_prompt + d, path, fmt)
    typer.echo(f"wrote {samples} samples of {n_bytes:,} bytes to {out.with_name(out.stem + '.*' + out.suffix)}",
               err=True)


def _sample_path(out: Path, i: int) -> Path:
    """Sample i's file of --samples N --out FILE: FILE's name with .i before its extension."""
    return out.with_name(f"{out.stem}.{i}{out.suffix}")


def _decode_prompt(path: Path, lm) -> bytes:
    """The first document of a file, decoded by the run's reader (or the one its extension picks)."""
    for doc in lm.read(path):
        return doc
    raise ConfigError(f"{path} holds no data to prompt with")


@app.command()
def score(
    file: Path = typer.Argument(..., help="File (or directory) whose content to score."),
    checkpoint: Optional[Path] = typer.Option(None, "--checkpoint", "-c", help="A run directory (its best weights; --last for the latest) or a checkpoint file (default: the latest run under ./runs)."),
    raw: bool = typer.Option(False, "--raw", help="Score the file's bytes as they are, not decoded by the run's reader."),
    device: str = typer.Option("cpu", help="cpu, cuda or auto."),
    last: bool = typer.Option(False, "--last", help="Use the run's latest weights, not its best."),
    adapt: bool = typer.Option(False, "--adapt", help="Score as `compress --adapt` codes: the documents joined, "
                               "in its streams, the model learning as it goes."),
    preset: str = typer.Option("", "--preset", help="With --adapt and no checkpoint: a seeded fresh model."),
    precision: Optional[str] = typer.Option(None, help=compress_cmd.SCORING_PRECISION_HELP),
):
    """Bits per byte of data under a model (lower = the model predicts it better).

    The file is decoded by the reader the run recorded (a FASTA file is scored on its bases, as
    the model was trained, whatever its name), each document scored from its start; --raw scores
    the bytes as they are.
    Example: bytemodel score held_out.fa
    """
    from ..readers import read_documents
    with user_errors():
        need_stdout()
        from .compress import _model_and_adapt
        if last and preset:
            raise ConfigError("--last names a run's weights; --preset starts a fresh model")
        if last:
            from .. import load
            lm, settings = load(checkpoint, device=device, precision=precision or compress_cmd.CODING_PRECISION,
                                last=True), None
            if adapt:
                from ..compress.adapt import settings as adapt_settings
                settings = adapt_settings(lm)
        else:
            lm, settings = _model_and_adapt(checkpoint, device, precision, adapt, preset, None, None, None)
        from .compress import _run_reader
        run_reader = _run_reader(lm)     # the reader the run recorded (a fresh --preset model: none)
        if not raw and getattr(lm, "data", None) is not None:
            _note_old_run(lm)
        view = "raw" if raw else (run_reader or None)
        with read_as_run(view, "--raw scores the bytes as they are"):
            if settings is not None:
                from ..compress.driver import compress as api_compress
                joined = b"".join(read_documents(file, view))
                stats: dict = {}
                if joined:
                    api_compress(lm, joined, adapt=settings, stats=stats)
                bits, n = stats.get("model_bits", 0.0), len(joined)
            else:               # documents streamed in pieces, windows scored in shared batches
                from ..decode.score import score_stream
                from ..readers import stream_documents
                r = score_stream(lm.model, lm.tokenizer, stream_documents(file, view))
                bits, n = r["bits"], r["bytes"]
        if n == 0:
            raise ConfigError(f"{file} holds no data to score")
        how = "as they are" if view == "raw" else f"read as {view}" if view else "read by detection"
        typer.echo(f"{file}: {bits / n:.4f} bits/byte ({bits:.0f} bits for {n:,} bytes, {how})")


@app.command()
def gradcheck(
    seed: int = typer.Option(0, help="Seed for weights, batch and the entries checked."),
    per_tensor: int = typer.Option(12, "--per-tensor", help="Entries checked per parameter tensor."),
    tie_embeddings: bool = typer.Option(False, "--tie-embeddings", help="Check the tied-embedding model."),
    mtp: int = typer.Option(3, "--mtp", help="Tokens predicted per position (1 = no multi-token heads)."),
    mtp_design: str = typer.Option("sequential", "--mtp-design", help="sequential or independent heads."),
):
    """Check every parameter tensor's gradient against finite differences (float64).

    Prints max relative error per tensor; exits 1 if any is above the bound.
    Example: bytemodel gradcheck --per-tensor 20
    """
    from ..gradcheck import BOUND, check_model, tiny_config
    with user_errors():
        if per_tensor <= 0:
            raise ConfigError(f"per-tensor must be positive, got {per_tensor}")
        rows = check_model(tiny_config(tie_embeddings=tie_embeddings, mtp=mtp, mtp_design=mtp_design),
                           per_tensor=per_tensor, seed=seed)
        w = max(len(r.name) for r in rows)
        typer.echo(f"{'tensor':<{w}}  checked  max rel error  (bound {BOUND:.0e})")
        for r in rows:
            typer.echo(f"{r.name:<{w}}  {r.checked:>7}  {r.max_rel_error:>13.2e}  {'ok' if r.ok else 'FAIL'}")
        bad = [r for r in rows if not r.ok]
        if bad:
            typer.echo(f"{len(bad)} tensor(s) above the bound", err=True)
            raise typer.Exit(1)
        typer.echo(f"all {len(rows)} tensors within {BOUND:.0e}")


@app.command()
def info(checkpoint: Optional[Path] = typer.Argument(None, help="Checkpoint or run directory (default: latest)."),
         checkpoint_opt: Optional[Path] = typer.Option(None, "--checkpoint", "-c", show_default=False,
                                                       help="The same as CHECKPOINT (as generate and score take it)."),
         last: bool = typer.Option(False, "--last", help="Describe the run's latest weights, not its best.")):
    """Describe a checkpoint: model, tokenizer, training state (a run's best weights by default).

    Example: bytemodel info runs/genome-1   (or: bytemodel info -c runs/genome-1)
    """
    from .. import checkpoint as ck, latest_run
    from ..model import n_params
    with user_errors():
        need_stdout()
        checkpoint = either(checkpoint, checkpoint_opt, "checkpoints", "--checkpoint")
        ld = ck.load(ck.model_path(checkpoint or latest_run(), last=last))
        c, t = ld.cfg, ld.train
        typer.echo(f"{ld.path}\nmodel: d_model {c.d_model}, layers {c.n_layers}, heads {c.n_heads}/{c.n_kv_heads}, "
                   f"ffn {c.d_ff}, context {c.context}, vocab {c.vocab_size}, {n_params(c):,} parameters")
        typer.echo(f"tokenizer: {ld.tokenizer.kind}, {ld.tokenizer.n_merges} merges")
        if t.get("config", {}).get("parent"):
            tc = t["config"]
            what = f"{tc.get('examples')} from " if tc.get("examples") else ""
            typer.echo(f"fine-tuned from {tc['parent']} (weights sha256 {tc.get('parent_sha256', '')[:12]}) "
                       f"on {what}{tc.get('source')}")
        if t:
            kind = "best weights" if t.get("best") else "latest weights"
            from ..training.progress import plus_minus
            se = plus_minus(t.get("val_se"))
            loop = t.get("loop") if isinstance(t.get("loop"), dict) else {}   # older runs: the settings' steps
            planned = loop.get("planned_steps", t.get("config", {}).get("steps"))
            val = t.get("val_bpb")
            val = f"{val:.4f}" if isinstance(val, (int, float)) and not isinstance(val, bool) else "none yet"
            typer.echo(f"trained: step {t.get('step')} of {planned} ({kind}), validation {val}{se} bits/byte")
            from ..runinfo import RunData, describe_bytes
            rd = RunData.of(t, str(ld.path))
            if rd.recorded:
                reader = (rd.reader if rd.reader else f"mixed ({', '.join(rd.readers)})" if rd.readers
                          else "none (examples)")
                typer.echo(f"data: {rd.source or '(not recorded)'}, reader {reader}, byte values "
                           + (describe_bytes(rd.byte_values) if rd.byte_values is not None else "not known (any byte)"))
            else:
                typer.echo(f"data: {rd.source or '(not recorded)'}, reader {rd.reader or 'detected per file'} "
                           f"(trained before runs recorded their reader and byte values)")


# sub-commands that live in their own modules beside this one
readers_cmd.register(app)
data_cmd.register(app)
tokenizer_cmd.register(app)
hf_cmd.register(app)
compress_cmd.register(app)
finetune_cmd.register(app)
plot_cmd.register(app)
tidy_help(app)


def main() -> None:
    import signal
    # `kill` (SIGTERM) unwinds like an error: temporary files and a fresh run's folder are removed
    # (raised where the threads can take it: errors.py, its end)
    signal.signal(signal.SIGTERM, exit_on_signal)
    roomy_malloc()      # freed memory kept for reuse, not faulted in again each step (memory.py)
    sys.exit(run_app(app))


if __name__ == "__main__":
    main()
