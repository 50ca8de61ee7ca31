"""`bytemodel compress`, `bytemodel decompress` and `bytemodel eval`: the model as a compressor."""
from __future__ import annotations

import json
from pathlib import Path
from typing import List, Optional

import typer

from .errors import check_out, read_as_run, user_errors
from ..errors import ConfigError
from ..fileguard import regular_file

SUFFIX = ".bmz"


def _run_reader(lm) -> str:
    """The reader spec the run recorded (runinfo: resolved when it trained; older runs: their
    settings'); "" when not known (a fresh --adapt model, a directory read by several readers)."""
    data = getattr(lm, "data", None)
    return (data.reader if data is not None else None) or ""


CODING_PRECISION = "fp16"   # a checkpoint's precision on cuda unless --precision says otherwise (compress, score, eval)
# score's and eval's --precision (both read the model as compress codes with it)
SCORING_PRECISION_HELP = ("On cuda: fp16 (what compress codes with, a fresh --preset model too), bf16 or fp32 "
                          "(the CPU's figures, many times slower); the CPU computes in fp32.")


def _model_and_adapt(checkpoint, device, precision, adapt, preset, lr, segment, optimizer, mix=None, stride=None):
    """The model to code with and the adaptation settings (None without --adapt)."""
    from .. import load
    from ..compress.adapt import Fresh, settings
    if not adapt and (preset or lr is not None or segment is not None or optimizer is not None or mix is not None
                      or stride is not None):
        raise ConfigError("--preset and --adapt-* need --adapt")
    if preset and checkpoint is not None:
        raise ConfigError("--preset starts a fresh model: give it or --checkpoint, not both")
    lm = (Fresh(preset, device, precision=precision) if preset
          else load(checkpoint, device=device, precision=precision or CODING_PRECISION))
    if not adapt:
        return lm, None
    return lm, settings(lm, segment=segment, lr=lr, optimizer=optimizer, mix=mix, stride=stride)


def _adapt_words(a) -> str:
    mixed = f"mixed with the file's counts ({a.mix})" if a.mix != "none" else "the network alone"
    some = f" on 1 stream in {a.stride}" if a.stride > 1 else ""
    return f"{a.optimizer} lr {a.lr:g} every {a.segment} tokens{some} from {a.start.replace(':', ' ')}, {mixed}"


def _file_reader(lm, file: Path):
    """The reader whose view the model codes: the run's (as it trained), else the file's detected one."""
    from ..readers import detect, get_reader
    spec = _run_reader(lm)
    return get_reader(spec) if spec else detect(file)


def compress(
    file: Path = typer.Argument(..., help="The file to compress (decompression gives its exact bytes back)."),
    checkpoint: Optional[Path] = typer.Option(None, "--checkpoint", "-c", help="A run directory (its best weights) or a checkpoint file (default: the latest run under ./runs)."),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="Output file (default: FILE.bmz; - for stdout)."),
    streams: Optional[int] = typer.Option(None, "--streams",
                                          help="Streams coded side by side (default: from the size and device)."),
    window: Optional[int] = typer.Option(None, "--window", help="Context window in tokens (default: 32 on the "
                                         "CPU, 16 with --adapt --preset, at most 256 on a GPU)."),
    reread: Optional[int] = typer.Option(None, "--reread", help="0 slides the window (the default); K re-reads "
                                         "the newest K tokens when it is full (on a GPU: 0 or K = window/2, as generation)."),
    device: str = typer.Option("cpu", help="cpu, cuda or auto (decompression must use the same)."),
    precision: Optional[str] = typer.Option(None, help="On cuda: fp16 (the default, from a checkpoint or a "
                                            "fresh --preset model), bf16 or fp32; decompress takes the file's."),
    workers: int = typer.Option(0, help="CPU threads (0: one per core, at most 256; the output does not depend on it)."),
    content: bool = typer.Option(False, "--content", help="Images: code the decoded pixels; decompression "
                                 "re-encodes them losslessly in the file's format (pixels exact, not its bytes)."),
    adapt: bool = typer.Option(False, "--adapt", help="Learn the file while coding it (an optimizer step after "
                               "every segment, repeated by the decoder; on a GPU the decoder needs the same GPU model)."),
    preset: str = typer.Option("", "--preset", help="With --adapt and no checkpoint: start from a seeded fresh "
                               "model of this preset (tiny, small): no training needed."),
    adapt_lr: Optional[float] = typer.Option(None, "--adapt-lr", help="Learning rate of --adapt (default: 3e-4 "
                                             "from a checkpoint, 2e-3 from a fresh model)."),
    adapt_segment: Optional[int] = typer.Option(None, "--adapt-segment", help="Tokens per stream between two "
                                                "updates (default 32)."),
    adapt_optimizer: Optional[str] = typer.Option(None, "--adapt-optimizer", help="adamw (default) or sgd."),
    adapt_mix: Optional[str] = typer.Option(None, "--adapt-mix", help="ctx3 (the CPU's default): the network mixed "
                                            "with counts of the file's own contexts and matches; ctx3f (a GPU's default): "
                                            "the same in fused kernels on the model's device; ctx3d: the same as "
                                            "CuPy calls (slower); ctx2: ctx3, its steps unscaled past 256 "
                                            "streams; ctx1: the first such mixer; none: the network alone."),
    adapt_stride: Optional[int] = typer.Option(None, "--adapt-stride", help="An update trains 1 stream in N "
                                               "(in turn), at 1/N of the cost (default: 8 from a fresh "
                                               "model, 1 from a checkpoint)."),
    force: bool = typer.Option(False, "--force", "-f", help="Overwrite the output file."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No summary line."),
):
    """Compress a file losslessly: range coding under the model's next-token probabilities.

    The model codes the run's reader's view of the file where that reader splits it exactly (a
    FASTA file's bases, a pcm16 WAV's samples) and a general-purpose coder the small rest
    (headers, line lengths); elsewhere the bytes as they are. Where the model would make the file
    larger (data unlike what it learnt), the bytes go in packed by xz / zlib instead. The summary
    line says which.

    The .bmz file names the checkpoint (and the SHA-256 of its weights and tokenizer), the device
    that computed the probabilities, and the original's length and SHA-256; decompress it with the
    same checkpoint on the same kind of device.
    Example: bytemodel compress genome.fa -c runs/genome-1   (writes genome.fa.bmz)
    Example: bytemodel compress book.txt --adapt --preset tiny   (no checkpoint: learns as it codes)
    """
    from ..atomic import write_atomic
    from ..compress.driver import compress as api_compress
    with user_errors():
        target = out or file.with_name(file.name + SUFFIX)
        check_out(target, force)
        data = regular_file(file, "input").read_bytes()
        lm, settings = _model_and_adapt(checkpoint, device, precision, adapt, preset, adapt_lr, adapt_segment,
                                        adapt_optimizer, adapt_mix, adapt_stride)
        stats: dict = {}
        blob = api_compress(lm, data, streams=streams, window=window, reread=reread, workers=workers or None,
                            stats=stats, reader=_file_reader(lm, file), content=content, adapt=settings)
        write_atomic(target, blob)
        if not quiet:
            n = len(data)
            rate = (f"{8 * len(blob) / n:.4f} bits/byte; model cross-entropy {stats.get('model_bits', 0) / n:.4f}, "
                    if n else "an empty file: the header and checksum only; ")
            streams = "" if stats["view"].kind == "packed" else f"{stats.get('streams', 0)} streams; "
            typer.echo(f"{file}: {n:,} -> {len(blob):,} bytes ({rate}{streams}{stats['view'].describe()}"
                       f"{'; adapting, ' + _adapt_words(settings) if settings else ''}) -> {target}", err=True)


def decompress(
    file: Path = typer.Argument(..., help="A .bmz file made by `bytemodel compress`."),
    checkpoint: Optional[Path] = typer.Option(None, "--checkpoint", "-c",
                                              help="The run directory or checkpoint file that compressed it "
                                                   "(default: the run under ./runs whose weights the file "
                                                   "names, found by their SHA-256)."),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="Output file (default: FILE without .bmz; - for stdout)."),
    device: str = typer.Option("", help="cpu or cuda (default: the device the file was compressed on)."),
    workers: int = typer.Option(0, help="CPU threads (0: one per core, at most 256; the output does not depend on it)."),
    force: bool = typer.Option(False, "--force", "-f", help="Overwrite the output file."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No summary line."),
):
    """Decompress a .bmz file: the exact original bytes, checked against its SHA-256.

    Nothing is written when the file is corrupt, was made with another checkpoint, or the result
    would not match the original's checksum. A file that `compress` stored or packed without the
    model (its summary said so) needs no checkpoint.
    Example: bytemodel decompress genome.fa.bmz -c runs/genome-1
    """
    from .. import load
    from ..atomic import write_atomic
    from ..compress.driver import decompress as api_decompress, read
    with user_errors():
        if out is None:
            if file.suffix != SUFFIX:
                raise ConfigError(f"{file} does not end in {SUFFIX}: give --out")
            out = file.with_suffix("")
        check_out(out, force)
        blob = regular_file(file, "input").read_bytes()
        header, _ = read(blob)
        backend = header["backend"]
        made_at = backend.get("precision", "fp32")
        start = (header.get("adapt") or {}).get("start", "checkpoint")
        if header["view"]["kind"] == "packed" and checkpoint is None:   # no model coded any of it: none is looked for
            lm = None
        elif start.startswith("preset:") and checkpoint is None:       # adapted from a fresh model: no checkpoint
            from ..compress.adapt import Fresh
            lm = Fresh(start.split(":", 1)[1], device or backend["device"], precision=made_at)
        else:
            if checkpoint is None:   # the run whose weights the file names, found in ./runs or ./NAME by hash
                from ..compress.container import find_run
                checkpoint = find_run(header)
            lm = load(checkpoint, device=device or backend["device"], precision=made_at)
        data = api_decompress(lm, blob, workers=workers or None)
        write_atomic(out, data)
        if not quiet:
            typer.echo(f"{file}: {len(blob):,} -> {len(data):,} bytes (SHA-256 checked, as compressed) -> {out}",
                       err=True)


def eval_files(
    files: List[Path] = typer.Argument(..., help="Files to measure (a directory: every file under it, a row each)."),
    checkpoint: Optional[Path] = typer.Option(None, "--checkpoint", "-c", help="A run directory (its best weights) or a checkpoint file (default: the latest run under ./runs)."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
    device: str = typer.Option("cpu", help="cpu, cuda or auto."),
    adapt: bool = typer.Option(False, "--adapt", help="The model's bits as `compress --adapt` codes each file."),
    preset: str = typer.Option("", "--preset", help="With --adapt and no checkpoint: a seeded fresh model."),
    precision: Optional[str] = typer.Option(None, help=SCORING_PRECISION_HELP),
):
    """Bits per byte of the model on each file next to gzip -9, bzip2 -9, xz -9e and zstd -19.

    Each file is measured as it is and, where the run's reader decodes it differently (a FASTA
    file's bases, an image's pixels), as the reader decodes it; then the totals. A directory
    stands for every non-hidden file under it (as `train` and `score` read one), in name order.
    Example: bytemodel eval held_out.fa other.fa -c runs/genome-1
    Example: bytemodel eval held_out/ -c runs/genome-1
    """
    from ..compress.evaluate import evaluate, table
    from ..readers import source_files
    with user_errors():
        files = [g for f in files for g in (source_files(f) if f.is_dir() else [regular_file(f, "input")])]
        lm, settings = _model_and_adapt(checkpoint, device, precision, adapt, preset, None, None, None)
        with read_as_run(_run_reader(lm) or None, "eval measures files of the run's kind (bytemodel score --raw "
                         "FILE scores any bytes)"):
            res = evaluate(lm, files, _run_reader(lm), adapt=settings)
        res["checkpoint"] = str(lm.path) if lm.path is not None else f"fresh {preset} (seed 0)"
        if settings is not None:
            res["adapt"] = settings.header()
        typer.echo(json.dumps(res, indent=1) if as_json else table(res))


def register(app: typer.Typer) -> None:
    app.command("compress")(compress)
    app.command("decompress")(decompress)
    app.command("eval")(eval_files)
