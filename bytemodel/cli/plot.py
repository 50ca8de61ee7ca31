"""`bytemodel plot RUN...`: overlay the loss curves of several runs in one chart (PNG, SVG or PDF)."""
from __future__ import annotations

from pathlib import Path

import typer

from .errors import user_errors


def register(app: typer.Typer) -> None:
    @app.command()
    def plot(runs: list[Path] = typer.Argument(..., help="Run directories (each with metrics.jsonl)."),
             out: Path = typer.Option(Path("runs.png"), "--out", "-o", help="Chart to write: .png, .svg or .pdf.")):
        """Overlay the runs' training and validation bits/byte against steps, with the compressors'
        figures as horizontal lines (each run also has its own loss.png).

        Example: bytemodel plot runs/genome-1 runs/genome-2 --out compare.png   (or compare.svg, .pdf)
        """
        from ..training.plot import plot_runs
        with user_errors():
            try:
                path = plot_runs(runs, out)
            except ImportError:
                from ..errors import ConfigError
                raise ConfigError("plotting needs matplotlib: pip install matplotlib") from None
            typer.echo(f"wrote {path}")
