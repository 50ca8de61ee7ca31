"""Help as a user reads it: no type placeholder on a flag, arguments named as in most tools.

typer's rich help prints `<bool>` beside every flag (--help included), names a required argument
`{file}` in the usage line, types a list `<list[Path]>` and keeps a docstring's line breaks
inside a paragraph. `tidy(app)` (run once, after every command is registered) reflows each
command's help (`reflow`), names each argument in capitals (FILE, FILES...), and two small overrides
of typer's help rendering leave a flag's type column empty, write a required argument as FILE
and an optional one as [RUN] (click's convention), and type a list by its items (<path>...).
Where a typer release lacks those methods the overrides do nothing and help still works.
"""
from __future__ import annotations

import inspect

import typer
from typer import core
from typer.models import ArgumentInfo


def _params(app: typer.Typer):
    for cmd in app.registered_commands:
        yield from inspect.signature(cmd.callback).parameters.values()
    for group in app.registered_groups:
        yield from _params(group.typer_instance)


def reflow(doc: str) -> str:
    """A docstring's paragraphs as one line each (the terminal wraps them), except lines that
    start with "Example:" or "On a cluster:", which keep their own line."""
    out = []
    for para in inspect.cleandoc(doc).split("\n\n"):
        lines = []
        for ln in para.splitlines():
            if lines and not ln.startswith(("Example:", "On a cluster:")):
                lines[-1] += " " + ln.strip()
            else:
                lines.append(ln.strip())
        out.append("\n".join(lines))
    return "\n\n".join(out)


def _commands(app: typer.Typer):
    yield from app.registered_commands
    for group in app.registered_groups:
        yield from _commands(group.typer_instance)


def _flag_type(original):
    def display_type_rich(self, ctx):
        if getattr(self, "is_flag", False):
            return None
        return original(self, ctx)
    return display_type_rich


def _usage_name(self) -> str:
    name = self.display_name_raw
    return name if self.required else f"[{name}]"


def _list_type(original):
    def display_type(self, ctx):
        label = original(self, ctx)
        if isinstance(label, str) and label.startswith("<list[") and label.endswith("]>"):
            return f"<{label[6:-2].lower()}>..."
        return label
    return display_type


def tidy(app: typer.Typer) -> None:
    for cmd in _commands(app):
        doc = cmd.help or cmd.callback.__doc__
        if doc:
            cmd.help = reflow(doc)
    for p in _params(app):
        info = p.default
        if isinstance(info, ArgumentInfo) and info.metavar is None:
            many = "list" in str(p.annotation).lower()
            info.metavar = p.name.upper() + ("..." if many else "")
    opt, arg = getattr(core, "TyperOption", None), getattr(core, "TyperArgument", None)
    if opt is not None and hasattr(opt, "display_type_rich") and not getattr(opt, "_tidied", False):
        opt.display_type_rich = _flag_type(opt.display_type_rich)
        opt._tidied = True
    if arg is not None and hasattr(arg, "_usage_display_name") and not getattr(arg, "_tidied", False):
        arg._usage_display_name = _usage_name
        if hasattr(arg, "display_type"):
            arg.display_type = _list_type(arg.display_type)
        arg._tidied = True
