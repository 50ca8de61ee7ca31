"""`bytemodel compress`, `bytemodel decompress` and `bytemodel eval`: the model as a compressor."""
from __future__ import annotations

import json
from pathlib import Path
from typing import List, Optional

import typer

from .errors import user_errors
from ..errors import ConfigError
from ..fileguard import regular_file

SUFFIX = ".bmz"


def _run_reader(lm) -> str:
    return str(lm.train_state.get("config", {}).get("reader", "") or "")


def _file_reader(lm, file: Path):
    """The reader whose view the model codes: the run's (as it trained), else the file's detected one."""
    from ..readers import detect, get_reader
    spec = _run_reader(lm)
    return get_reader(spec) if spec else detect(file)


def _check_out(out: Path, force: bool) -> None:
    if out.exists() and not force:
        raise ConfigError(f"{out} exists (use --force to overwrite it)")
    if out.is_dir():
        raise ConfigError(f"{out} is a directory")


def compress(
    file: Path = typer.Argument(..., help="The file to compress (decompression gives its exact bytes back)."),
    checkpoint: Optional[Path] = typer.Option(None, "--checkpoint", "-c", help="(default: latest run)"),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="Output file (default: FILE.bmz)."),
    streams: Optional[int] = typer.Option(None, "--streams",
                                          help="Streams coded side by side (default: from the size and device)."),
    window: Optional[int] = typer.Option(None, "--window", help="Context window in tokens (default: 32 on the "
                                         "CPU, at most 256 on a GPU)."),
    reread: Optional[int] = typer.Option(None, "--reread", help="0 slides the window (the default); K re-reads "
                                         "the newest K tokens when it is full (on a GPU: 0 or K = window/2, as generation)."),
    device: str = typer.Option("cpu", help="cpu, cuda or auto (decompression must use the same)."),
    precision: str = typer.Option("fp16", help="On cuda: fp16, bf16 or fp32."),
    workers: int = typer.Option(0, help="CPU threads (0: one per core; the output does not depend on it)."),
    content: bool = typer.Option(False, "--content", help="Images: code the decoded pixels; decompression "
                                 "re-encodes them losslessly in the file's format (pixels exact, not its bytes)."),
    force: bool = typer.Option(False, "--force", "-f", help="Overwrite the output file."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No summary line."),
):
    """Compress a file losslessly: range coding under the model's next-token probabilities.

    The model codes the run's reader's view of the file where that reader splits it exactly (a
    FASTA file's bases, a pcm16 WAV's samples) and a general-purpose coder the small rest
    (headers, line lengths); elsewhere the bytes as they are. The summary line says which.

    The .bmz file names the checkpoint (and the SHA-256 of its weights and tokenizer), the device
    that computed the probabilities, and the original's length and SHA-256; decompress it with the
    same checkpoint on the same kind of device.
    Example: bytemodel compress genome.fa -c runs/genome-1   (writes genome.fa.bmz)
    """
    from .. import load
    from ..atomic import write_atomic
    from ..compress.driver import compress as api_compress
    with user_errors():
        target = out or file.with_name(file.name + SUFFIX)
        _check_out(target, force)
        data = regular_file(file, "input").read_bytes()
        lm = load(checkpoint, device=device, precision=precision)
        stats: dict = {}
        blob = api_compress(lm, data, streams=streams, window=window, reread=reread, workers=workers or None,
                            stats=stats, reader=_file_reader(lm, file), content=content)
        write_atomic(target, blob)
        if not quiet:
            n = max(len(data), 1)
            typer.echo(f"{file}: {len(data):,} -> {len(blob):,} bytes ({8 * len(blob) / n:.4f} bits/byte; "
                       f"model cross-entropy {stats.get('model_bits', 0) / n:.4f}, {stats.get('streams', 0)} "
                       f"streams; {stats['view'].describe()}) -> {target}", err=True)


def decompress(
    file: Path = typer.Argument(..., help="A .bmz file made by `bytemodel compress`."),
    checkpoint: Optional[Path] = typer.Option(None, "--checkpoint", "-c",
                                              help="(default: the run under ./runs whose weights the "
                                                   "file names, found by their SHA-256)"),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="Output file (default: FILE without .bmz)."),
    device: str = typer.Option("", help="cpu or cuda (default: the device the file was compressed on)."),
    workers: int = typer.Option(0, help="CPU threads (0: one per core; the output does not depend on it)."),
    force: bool = typer.Option(False, "--force", "-f", help="Overwrite the output file."),
):
    """Decompress a .bmz file: the exact original bytes, checked against its SHA-256.

    Nothing is written when the file is corrupt, was made with another checkpoint, or the result
    would not match the original's checksum.
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
        _check_out(out, force)
        blob = regular_file(file, "input").read_bytes()
        header, _ = read(blob)
        backend = header["backend"]
        if checkpoint is None:   # the run whose weights the file names, found among ./runs by hash
            from ..compress.container import find_run
            checkpoint = find_run(header)
        lm = load(checkpoint, device=device or backend["device"], precision=backend.get("precision", "fp32"))
        data = api_decompress(lm, blob, workers=workers or None)
        write_atomic(out, data)


def eval_files(
    files: List[Path] = typer.Argument(..., help="Files to measure."),
    checkpoint: Optional[Path] = typer.Option(None, "--checkpoint", "-c", help="(default: latest run)"),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
    device: str = typer.Option("cpu", help="cpu, cuda or auto."),
):
    """Bits per byte of the model on each file next to gzip -9, bzip2 -9, xz -9e and zstd -19.

    Each file is measured as it is and, where the run's reader decodes it differently (a FASTA
    file's bases, an image's pixels), as the reader decodes it; then the totals.
    Example: bytemodel eval held_out.fa other.fa -c runs/genome-1
    """
    from .. import load
    from ..compress.evaluate import evaluate, table
    with user_errors():
        for f in files:
            regular_file(f, "input")
        lm = load(checkpoint, device=device)
        res = evaluate(lm, files, _run_reader(lm))
        res["checkpoint"] = str(lm.path)
        typer.echo(json.dumps(res, indent=1) if as_json else table(res))


def register(app: typer.Typer) -> None:
    app.command("compress")(compress)
    app.command("decompress")(decompress)
    app.command("eval")(eval_files)
