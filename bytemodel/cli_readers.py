"""CLI commands for readers and datasets: `bytemodel readers`, `bytemodel data list|get`.

``register(app)`` adds them to the main typer app (bytemodel/cli.py calls it). User errors
(BytemodelError) print as one line on stderr with exit status 2, like every bytemodel command.
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from .cli_errors import user_errors


def _table(title: str, columns: list[str], rows: list[list[str]]) -> None:
    from rich.console import Console
    from rich.table import Table
    t = Table(title=title, title_justify="left", show_lines=False)
    for c in columns:
        t.add_column(c, overflow="fold")
    for r in rows:
        t.add_row(*r)
    Console(width=max(100, Console().width)).print(t)


def readers() -> None:
    """List the readers: name, the extensions it claims, its options and what it does.

    Pick one with --reader NAME or NAME:option=value,flag (e.g. image:size=64x64,gray).

    Example: bytemodel readers
    """
    from .readers import list_readers
    with user_errors():
        rows = []
        for cls in list_readers():
            exts = " ".join(e for e in cls.extensions if e.count(".") == 1) or "(fallback)"
            rows.append([cls.name, exts, " ".join(sorted(cls.OPTIONS)) or "-", cls.description])
        _table("readers", ["name", "extensions", "options", "description"], rows)


data_app = typer.Typer(no_args_is_help=True, add_completion=False,
                       help="Named real datasets: list them, fetch one (offline-first, checksummed).")


@data_app.command("list")
def data_list() -> None:
    """List the catalogue: name, type, reader, size, licence, and whether it is available here.

    Example: bytemodel data list
    """
    from .datasets import availability, describe_source, load_catalogue
    with user_errors():
        rows = [[d.name, d.type, d.reader, d.size, ", ".join(describe_source(s) for s in d.sources),
                 availability(d), d.licence] for d in load_catalogue().values()]
        _table("datasets", ["name", "type", "reader", "size", "sources", "here", "licence"], rows)


@data_app.command("get")
def data_get(
    name: str = typer.Argument(..., help="Dataset name (see `bytemodel data list`)."),
    dest: Optional[Path] = typer.Option(None, "--dest", "-d", help="Folder to put the files in "
                                        "(default: the cache, $BYTEMODEL_CACHE or ~/.cache/bytemodel)."),
    download: bool = typer.Option(False, "--download", help="Allow a download when no local copy exists."),
) -> None:
    """Fetch a dataset and print the folder it is in (checksums verified; local copies first).

    Example: bytemodel train --source "$(bytemodel data get lambda-phage)" --reader fasta
    """
    from .datasets import get, get_dataset
    with user_errors():
        path = get(name, dest=dest, download=download)
        ds = get_dataset(name)
        typer.echo(f"{ds.name}: {ds.description} (reader: {ds.reader})", err=True)
        typer.echo(str(path))


def register(app: typer.Typer) -> None:
    """Add `readers` and `data` to the main CLI."""
    app.command("readers")(readers)
    app.add_typer(data_app, name="data")
