"""CLI commands for the dataset catalogue: `bytemodel data list|get`.

``register(app)`` adds the `data` group to the main typer app (bytemodel/cli/__init__.py calls it).
User errors (BytemodelError) print as one line on stderr with exit status 2, like every command.
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from .errors import a_folder, user_errors
from .readers import table

data_app = typer.Typer(no_args_is_help=True, add_completion=False,
                       help="Named real datasets: list them, fetch one (offline-first, checksummed).")


@data_app.command("list")
def data_list() -> None:
    """List the catalogue: name, type, reader, size, licence, and whether it is available here.

    Example: bytemodel data list
    """
    from ..catalogue import availability, describe_source, load_catalogue
    with user_errors():
        rows = [[d.name, d.type, d.reader, d.size, ", ".join(describe_source(s) for s in d.sources),
                 availability(d), d.licence] for d in load_catalogue().values()]
        table("datasets", ["name", "type", "reader", "size", "sources", "here", "licence"], rows)


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
    from ..catalogue import get, get_dataset
    with user_errors():
        path = get(name, dest=a_folder(dest, "--dest"), download=download)
        ds = get_dataset(name)
        typer.echo(f"{ds.name}: {ds.description} (reader: {ds.reader})", err=True)
        typer.echo(str(path))


def register(app: typer.Typer) -> None:
    """Add `data` to the main CLI."""
    app.add_typer(data_app, name="data")
