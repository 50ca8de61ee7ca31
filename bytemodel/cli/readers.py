"""CLI command for readers: `bytemodel readers`.

``register(app)`` adds it to the main typer app (bytemodel/cli/__init__.py calls it). User errors
(BytemodelError) print as one line on stderr with exit status 2, like every bytemodel command.
"""
from __future__ import annotations

import typer

from .errors import need_stdout, user_errors


def table(title: str, columns: list[str], rows: list[list[str]]) -> None:
    from rich.console import Console
    from rich.table import Table
    t = Table(title=title, title_justify="left", show_lines=False)
    name_width = max([len(columns[0])] + [len(r[0]) for r in rows])
    for i, c in enumerate(columns):    # the first column (a name to type back) is never cut
        t.add_column(c, overflow="fold", no_wrap=i == 0, min_width=name_width if i == 0 else None)
    for r in rows:
        t.add_row(*r)
    Console(width=max(100, Console().width)).print(t)


def readers() -> None:
    """List the readers: name, the extensions it claims, its options and what it does.

    Pick one with --reader NAME or NAME:option=value,flag (e.g. image:size=64x64,gray).

    Example: bytemodel readers
    """
    from ..readers import list_readers
    with user_errors():
        need_stdout()
        rows = []
        for cls in list_readers():
            exts = " ".join(e for e in cls.extensions if e.count(".") == 1) or "(fallback)"
            rows.append([cls.name, exts, " ".join(sorted(cls.OPTIONS)) or "-", cls.description])
        table("readers", ["name", "extensions", "options", "description"], rows)


def register(app: typer.Typer) -> None:
    """Add `readers` to the main CLI."""
    app.command("readers")(readers)
