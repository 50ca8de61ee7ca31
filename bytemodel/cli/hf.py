"""CLI commands for the Hugging Face format: `bytemodel export` and `bytemodel import-hf`.

``register(app)`` adds them to the main typer app (bytemodel/cli/__init__.py calls it). User
errors print as
one line on stderr with exit status 2.
"""
from __future__ import annotations

from pathlib import Path

import typer

from .errors import a_folder, either, user_errors


def _one_out(positional, option, name: str) -> Path:
    """The output directory, given as a second argument or as --out / -o (either, not two)."""
    from ..errors import ConfigError
    out = either(positional, option, "output directories", "--out")
    if out is None:
        raise ConfigError(f"give the directory to write ({name})")
    return a_folder(out, name)


def export(
    run: Path = typer.Argument(..., help="Run directory or checkpoint file to export."),
    out_dir: Path = typer.Argument(None, help="Directory to write (created; must be empty unless --force).",
                                   show_default=False),
    out: Path = typer.Option(None, "--out", "-o", help="The same as OUT_DIR (as compress and import-hf take it).",
                             show_default=False),
    fmt: str = typer.Option("hf", "--format", "-f", help="hf: a Hugging Face transformers Llama directory."),
    force: bool = typer.Option(False, "--force", help="Replace OUT_DIR if it is not empty (never a folder holding a bytemodel run)."),
    last: bool = typer.Option(False, "--last", help="Export the latest weights, not the best validation's."),
) -> None:
    """Export a checkpoint for other tools: config.json, model.safetensors, tokenizer, README.md.

    The result loads with transformers' AutoModelForCausalLM / AutoTokenizer (see its README.md).
    Example: bytemodel export runs/genome-1 --format hf hf-genome
    """
    from ..hf import export_hf
    with user_errors():
        res = export_hf(run, _one_out(out_dir, out, "OUT_DIR"), force=force, fmt=fmt, last=last)
        if res.dropped:
            typer.echo(f"note: not exported (no place in a Llama model): {', '.join(res.dropped)}", err=True)
        typer.echo(f"wrote {res.out_dir}: {', '.join(res.files)}")


def import_hf(
    hf_dir: Path = typer.Argument(..., help="Hugging Face model directory (config.json + safetensors)."),
    out_dir: Path = typer.Argument(None, help="The same as --out (as export takes it).", show_default=False),
    out: Path = typer.Option(None, "--out", "-o", help="Run directory to write checkpoint.safetensors into.",
                             show_default=False),
    force: bool = typer.Option(False, "--force", help="Replace an earlier import's checkpoint in --out (never a trained run's)."),
) -> None:
    """Turn a Hugging Face Llama directory (e.g. from `bytemodel export`) into a bytemodel checkpoint.

    Example: bytemodel import-hf hf-genome --out runs/genome-back
    """
    from ..hf import import_hf as _import
    from ..model import n_params
    with user_errors():
        res = _import(hf_dir, _one_out(out_dir, out, "--out"), force=force)
        if res.note:
            typer.echo(f"note: {res.note}", err=True)
        c = res.cfg
        typer.echo(f"wrote {res.checkpoint}: {c.n_layers} layers, width {c.d_model}, vocab {c.vocab_size} "
                   f"({res.tokenizer.n_merges} merges), {n_params(c):,} parameters")


def register(app: typer.Typer) -> None:
    app.command("export")(export)
    app.command("import-hf")(import_hf)
