"""CLI commands for byte-pair tokenizers: `bytemodel tokenizer train|stats|encode|decode`.

``register(app)`` adds the `tokenizer` sub-command group to the main typer app (bytemodel/cli/__init__.py
calls it). User errors (BytemodelError) print as one line on stderr with exit status 2. train, encode
and decode print their summary line on stderr, so an output of -o /dev/stdout holds only the data;
stats prints its report on stdout.

Files: tok.json (see bytemodel.tokenizer); ids files are raw uint16 little-endian, one id per 2 bytes.
"""
from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Optional

import numpy as np
import typer

from ..errors import TokenizerError
from .errors import either, user_errors

tokenizer_app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                            help="Byte-pair merges on top of bytes: train, stats, encode, decode.")


def _show(b: bytes) -> str:
    """A token's bytes as a short printable literal: b'the' -> 'the', b'\\x00\\n' -> '\\x00\\n'."""
    return repr(b)[2:-1]


@tokenizer_app.command("train")
def train_cmd(
    source_arg: Optional[str] = typer.Argument(None, metavar="SOURCE", show_default=False,
                                               help="The same as --source (either, not two)."),
    source: Optional[str] = typer.Option(None, "--source", "-s", help="File or directory of any bytes to learn from."),
    merges: int = typer.Option(..., "--merges", "-m", help="Number of merges M (vocabulary 256 + M + specials)."),
    out: Path = typer.Option(Path("tok.json"), "--out", "-o", help="Tokenizer file to write (- for stdout)."),
    pre_split: Optional[str] = typer.Option(None, "--pre-split", help="'text': split words/spaces/digits first."),
    max_sample_mb: float = typer.Option(16.0, "--max-sample-mb", help="Learn from a sample of at most this many MiB."),
    seed: int = typer.Option(0, help="Seed of the sample choice (only used when the source exceeds the sample)."),
    reader: str = typer.Option("", help="Reader name (default: detected from the file)."),
) -> None:
    """Learn M merges from a file or folder of any bytes and save them as tok.json.

    Example: bytemodel tokenizer train corpus.txt --merges 4096 --out tok.json   (or --source corpus.txt)
    """
    from ..readers import stream_documents
    from ..tokenizer import Tokenizer
    with user_errors():
        source = either(source_arg, source, "sources", "--source")
        if source is None:
            raise TokenizerError("give the data to learn from: bytemodel tokenizer train PATH --merges M "
                                 "(or --source PATH)")
        if not (max_sample_mb > 0 and math.isfinite(max_sample_mb)):
            raise TokenizerError(f"max-sample-mb must be a positive number, got {max_sample_mb}")
        t0 = time.perf_counter()
        docs = stream_documents(source, reader or None)   # pieces: no document is held whole
        tok = Tokenizer.train(docs, merges, pre_split=pre_split,
                              max_sample_bytes=int(max_sample_mb * (1 << 20)), seed=seed)
        tok.save(out)
        typer.echo(f"{out}: {tok.n_merges} merges, vocabulary {tok.vocab_size} "
                   f"({time.perf_counter() - t0:.1f} s)", err=True)   # stdout may be the output (-o /dev/stdout)


@tokenizer_app.command("stats")
def stats_cmd(
    file: str = typer.Argument(..., help="File or directory to measure on."),
    tokenizer: Path = typer.Option(..., "--tokenizer", "-t", help="tok.json"),
    top: int = typer.Option(10, help="How many merges and tokens to list."),
    reader: str = typer.Option("", help="Reader name (default: detected from the file)."),
) -> None:
    """Bytes per token on FILE, the vocabulary size, the first merges and the most used tokens.

    Example: bytemodel tokenizer stats --tokenizer tok.json corpus.txt
    """
    from ..readers import read_documents
    from ..tokenizer import Tokenizer
    with user_errors():
        tok = Tokenizer.load(tokenizer)
        n_bytes = n_tok = 0
        use = np.zeros(tok.vocab_size, dtype=np.int64)
        t0 = time.perf_counter()
        for doc in read_documents(file, reader or None):
            ids = tok.encode(doc)
            n_bytes += len(doc)
            n_tok += len(ids)
            use += np.bincount(ids, minlength=tok.vocab_size)
        dt = time.perf_counter() - t0
        typer.echo(f"tokenizer: {tokenizer} ({tok.n_merges} merges, vocabulary {tok.vocab_size}, "
                   f"pre-split {tok.pre_split or 'none'})")
        bpt = n_bytes / n_tok if n_tok else 0.0
        typer.echo(f"{file}: {n_bytes:,} bytes -> {n_tok:,} tokens, {bpt:.3f} bytes/token "
                   f"({n_bytes / max(dt, 1e-9) / 1e6:.1f} MB/s)")
        if tok.n_merges:
            shown = ", ".join(f"'{_show(tok.vocab[256 + i])}'" for i in range(min(top, tok.n_merges)))
            typer.echo(f"first merges: {shown}")
            longest = sorted(range(256, 256 + tok.n_merges), key=lambda i: (-len(tok.vocab[i]), i))[:top]
            typer.echo("longest tokens: " + ", ".join(f"'{_show(tok.vocab[i])}'" for i in longest))
        order = np.argsort(-use, kind="stable")[:top]
        typer.echo("most used: " + ", ".join(f"'{_show(tok.vocab[i])}' {use[i] / max(n_tok, 1):.1%}"
                                             for i in order if use[i]))
        typer.echo(f"unused ids: {int((use[:256 + tok.n_merges] == 0).sum())} of {256 + tok.n_merges}")


@tokenizer_app.command("encode")
def encode_cmd(
    file: Path = typer.Argument(..., help="File whose raw bytes to encode."),
    tokenizer: Path = typer.Option(..., "--tokenizer", "-t", help="tok.json"),
    out: Path = typer.Option(..., "--out", "-o", help="Output ids file (uint16 little-endian; - for stdout)."),
) -> None:
    """Encode the raw bytes of FILE into token ids (uint16 little-endian), in bounded memory.

    Example: bytemodel tokenizer encode --tokenizer tok.json corpus.txt --out corpus.ids
    """
    from ..atomic import write_atomic
    from ..tokenizer import Tokenizer
    with user_errors():
        tok = Tokenizer.load(tokenizer)
        from ..fileguard import regular_file
        regular_file(file, "input", TokenizerError)   # '-' and a missing file said only "not a file"
        t0 = time.perf_counter()
        counts = []
        write_atomic(out, lambda f: counts.append(tok.encode_file(file, f)), error=TokenizerError)
        n_in, n_out = counts[0]
        dt = time.perf_counter() - t0
        typer.echo(f"{out}: {n_in:,} bytes -> {n_out:,} ids ({n_in / max(n_out, 1):.3f} bytes/token, "
                   f"{n_in / max(dt, 1e-9) / 1e6:.1f} MB/s)", err=True)


@tokenizer_app.command("decode")
def decode_cmd(
    file: Path = typer.Argument(..., help="Ids file (uint16 little-endian)."),
    tokenizer: Path = typer.Option(..., "--tokenizer", "-t", help="tok.json"),
    out: Path = typer.Option(..., "--out", "-o", help="Output file of bytes (- for stdout)."),
) -> None:
    """Decode token ids (uint16 little-endian) back into bytes; special ids give no bytes.

    Example: bytemodel tokenizer decode --tokenizer tok.json corpus.ids --out corpus.txt
    """
    from ..atomic import write_atomic
    from ..tokenizer import Tokenizer
    with user_errors():
        tok = Tokenizer.load(tokenizer)
        from ..fileguard import regular_file
        size = regular_file(file, "ids file", TokenizerError).stat().st_size
        if size % 2:
            raise TokenizerError(f"{file} has an odd number of bytes ({size}); not a uint16 ids file")
        n = n_bytes = 0

        def write(fout):
            nonlocal n, n_bytes
            with open(file, "rb") as fin:
                while True:
                    chunk = fin.read(1 << 22)
                    if not chunk:
                        break
                    ids = np.frombuffer(chunk, dtype="<u2")
                    data = tok.decode(ids)
                    fout.write(data)
                    n += len(ids)
                    n_bytes += len(data)   # counted: a device or pipe (/dev/stdout) has no size to stat
        write_atomic(out, write, error=TokenizerError)
        typer.echo(f"{out}: {n:,} ids -> {n_bytes:,} bytes", err=True)


def register(app: typer.Typer) -> None:
    """Add the `tokenizer` command group to the main CLI."""
    app.add_typer(tokenizer_app, name="tokenizer")
