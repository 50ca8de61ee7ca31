"""How every CLI command reports user errors: one line on stderr, exit status 2, no traceback."""
from __future__ import annotations

import contextlib
import os
import sys

import typer

from ..errors import BytemodelError, cli_names


@contextlib.contextmanager
def user_errors():
    """Turn user errors into one line and exit status 2; never a traceback. Messages raised
    inside name the CLI's flags (errors.named)."""
    try:
        with cli_names():
            yield
    except BytemodelError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2)
    except KeyboardInterrupt:
        typer.echo("interrupted", err=True)
        raise typer.Exit(130)
    except MemoryError as e:
        typer.echo(f"error: out of memory{_oom_hint(e)}", err=True)
        raise typer.Exit(2)
    except BrokenPipeError:
        # the reader of our stdout stopped reading (`bytemodel generate | head`): end quietly, as a
        # process stopped by SIGPIPE does (status 141), and keep Python's exit-time flush from
        # reporting the same pipe again
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        except (OSError, ValueError, AttributeError):
            pass
        raise typer.Exit(141)
    except OSError as e:
        typer.echo(f"error: {e.strerror or e}: {getattr(e, 'filename', '') or ''}".rstrip(": "), err=True)
        raise typer.Exit(2)


def _oom_hint(e: BaseException) -> str:
    """The model's sizes are the advice only where the model ran out (its ops or layers); memory
    that ran out while reading a file says so instead."""
    import traceback
    files = [f.filename.replace(os.sep, "/") for f in traceback.extract_tb(e.__traceback__)]
    if any("/bytemodel/ops/" in f or f.endswith(("/bytemodel/model.py", "/bytemodel/mtp.py")) for f in files):
        return " (try a smaller --batch-size, --context or preset)"
    return " (the input needs more memory than is free)"


def need_stdout() -> None:
    """Refuse to run a command whose output is its stdout when stdout is closed (`>&-`)."""
    if sys.stdout is None:
        from ..errors import ConfigError
        raise ConfigError("stdout is closed: this command prints its result there")


@contextlib.contextmanager
def read_as_run(view, advice: str):
    """Files read with the run's reader (score, eval; view: its spec, None for detection, "raw"):
    a file that is not of the reader's format is one line saying so and what this command offers
    (advice), not the reader's own advice to use --reader, a flag these commands lack."""
    from ..errors import SourceError
    try:
        yield
    except SourceError as e:
        if e.fact is None or view == "raw":
            raise
        how = f"the run reads its files as {view}" if view else "read by the reader its name picks"
        raise SourceError(f"{e.fact} ({how}); {advice}") from None


def a_folder(path, flag: str):
    """A folder to write into (a run directory, an export, a dataset's): '-' is standard output to
    the commands that write a file, and no folder: refused, not made as a folder named '-'."""
    from ..fileguard import is_stdio
    if path is not None and is_stdio(path):
        from ..errors import ConfigError
        raise ConfigError(f"{flag} names a folder; '-' (standard output) cannot be one")
    return path


def either(positional, option, what: str, flag: str):
    """A value a command takes as an argument or as an option (`train FILE` or `train --source
    FILE`): the one given, None if neither; both given and different is a user error."""
    if positional is not None and option is not None and str(positional) != str(option):
        from ..errors import ConfigError
        raise ConfigError(f"two {what} given ({positional} and {flag} {option}): give one")
    return positional if positional is not None else option


def _click_exceptions():
    """click's exception classes: typer carries its own copy of click from 0.2x on, depends on it before."""
    try:
        from typer._click import exceptions
    except ImportError:
        from click import exceptions
    return exceptions


def run_app(app, args=None) -> int:
    """Run the CLI and return its exit status. A usage mistake (an option that does not exist, a
    value that is not a number, a missing argument) is one line too, as every other user error:
    `error: No such option: --stepz (Possible options: --mtp, --seed, --steps) ('bytemodel train
    --help' lists the options)`, status 2, where click drew a box of five lines under the usage.
    `bytemodel` alone still prints the help (status 2), --help still exits 0."""
    ex = _click_exceptions()
    try:
        rv = app(args=args, standalone_mode=False)
    except getattr(ex, "NoArgsIsHelpError", ()) as e:      # `bytemodel`, `bytemodel data`: the help
        e.show()
        return e.exit_code
    except ex.UsageError as e:
        what = "commands" if hasattr(getattr(e.ctx, "command", None), "commands") else "options"
        where = f" ('{e.ctx.command_path} --help' lists the {what})" if e.ctx is not None else ""
        sys.stderr.write(f"error: {' '.join(e.format_message().split())}{where}\n")
        return 2
    except ex.ClickException as e:
        e.show()
        return e.exit_code
    except typer.Abort:         # (typer's own class: click's copy inside typer 0.2x has none)
        sys.stderr.write("interrupted\n")
        return 130
    return rv if isinstance(rv, int) else 0    # an Exit's code (--help: 0); a command's None: 0


def check_out(out, force: bool) -> None:
    """Refuse to replace a file without --force (compress, decompress, generate); standard output
    ('-'), a device (/dev/null) and a FIFO are written through (fileguard.py) and replace nothing,
    so they need no --force."""
    from ..errors import ConfigError
    from ..fileguard import is_stdio
    if is_stdio(out):
        return
    if out.is_dir():
        raise ConfigError(f"{out} is a directory")
    if out.is_file() and not force:
        raise ConfigError(f"{out} exists (use --force to overwrite it)")
