"""The house rules that keep the package readable, measured on its source (issue 21):
no function longer than MAX_FUNCTION lines, the training loop's main method on one screen, and a
root of bytemodel/ that holds at most MAX_ROOT modules (new modules go into a wing or a package)."""
from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parent.parent / "bytemodel"
MAX_FUNCTION = 120   # lines, decorators excluded, docstring included
MAX_LOOP = 80        # lines of Loop.run, the training loop as a reader meets it
MAX_ROOT = 22        # modules directly in bytemodel/ (__init__.py included)


def _functions(pkg: Path = PKG):
    for path in sorted(pkg.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                yield path.relative_to(pkg.parent), node


def _length(node) -> int:
    return node.end_lineno - node.lineno + 1


def _too_long(pkg: Path = PKG) -> list[str]:
    return [f"{p}:{n.lineno} {n.name} ({_length(n)} lines)" for p, n in _functions(pkg) if _length(n) > MAX_FUNCTION]


def test_no_function_is_longer_than_the_limit():
    long = _too_long()
    assert not long, f"functions over {MAX_FUNCTION} lines: " + "; ".join(long)


def test_the_training_loop_fits_on_a_screen():
    runs = [n for p, n in _functions() if p.as_posix() == "bytemodel/training/loop.py" and n.name == "run"]
    assert len(runs) == 1, "Loop.run not found in bytemodel/training/loop.py"
    assert _length(runs[0]) <= MAX_LOOP, f"Loop.run is {_length(runs[0])} lines (limit {MAX_LOOP})"


def test_the_root_holds_few_modules():
    root = sorted(p.name for p in PKG.glob("*.py"))
    assert len(root) <= MAX_ROOT, f"{len(root)} modules in bytemodel/ (limit {MAX_ROOT}): {root}"


def test_an_over_long_function_is_found(tmp_path):
    """The check itself: a nested method one line over the limit is reported, one at it is not."""
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    body = lambda n: "        x = 1\n" * (n - 1)   # noqa: E731  (def line + n - 1 lines = n)
    (pkg / "m.py").write_text(f"class A:\n    def ok(self):\n{body(MAX_FUNCTION)}"
                              f"    def long(self):\n{body(MAX_FUNCTION + 1)}")
    assert [r.split()[1] for r in _too_long(pkg)] == ["long"]


def test_cupy_is_imported_only_under_ops():
    """The device shows in ops/ alone (the backends, the GPU decoder, NCCL): nothing else imports CuPy."""
    found = []
    for path in sorted(PKG.rglob("*.py")):
        rel = path.relative_to(PKG).as_posix()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            if any(n == "cupy" or n.startswith("cupy.") for n in names) and not rel.startswith("ops/"):
                found.append(f"{rel}:{node.lineno}")
    assert not found, "CuPy imported outside ops/: " + ", ".join(found)
