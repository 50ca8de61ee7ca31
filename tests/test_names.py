"""Every name a file takes from bytemodel exists: a static check, so the GPU tests, the GPU
benchmarks and the examples (which cannot run here, no GPU) still refer only to modules and names
that the package defines after a move or a rename.

Read with ast, nothing imported (the CUDA modules need CuPy): each file must compile; each
`import bytemodel.X` and `from bytemodel.X import a` (and the package's relative imports) must name
a module file, and each `a` a submodule or a name bound at the top of that module; and `mod.b`,
where `mod` is a bytemodel module the file imported, must name something bound at mod's top.
"""
from __future__ import annotations

import ast
from functools import lru_cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("bytemodel", "benchmarks", "tests", "examples", "datasets")


def python_files() -> list[Path]:
    return sorted(p for d in FOLDERS for p in (ROOT / d).rglob("*.py") if "__pycache__" not in p.parts)


def module_file(root: Path, dotted: str) -> Path | None:
    """bytemodel.a.b -> root/bytemodel/a/b.py or .../b/__init__.py, or None."""
    base = root.joinpath(*dotted.split("."))
    for p in (base.with_suffix(".py"), base / "__init__.py"):
        if p.is_file():
            return p
    return None


def _bound(tree: ast.Module) -> set[str]:
    """Names bound at a module's top level (also inside top-level if/try, as optional imports are)."""
    names: set[str] = set()

    def visit(stmts):
        for s in stmts:
            if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(s.name)
            elif isinstance(s, (ast.Assign, ast.AnnAssign, ast.AugAssign, ast.For, ast.With)):
                targets = (s.targets if isinstance(s, ast.Assign) else
                           [s.target] if not isinstance(s, ast.With) else
                           [i.optional_vars for i in s.items if i.optional_vars is not None])
                for t in targets:
                    names.update(n.id for n in ast.walk(t) if isinstance(n, ast.Name))
                if isinstance(s, (ast.For, ast.With)):
                    visit(s.body)
            elif isinstance(s, (ast.Import, ast.ImportFrom)):
                names.update((a.asname or a.name).split(".")[0] for a in s.names)
            elif isinstance(s, ast.If):
                visit(s.body)
                visit(s.orelse)
            elif isinstance(s, ast.Try):
                visit(s.body)
                visit(s.orelse)
                visit(s.finalbody)
                for h in s.handlers:
                    visit(h.body)
    visit(tree.body)
    return names


@lru_cache(maxsize=None)
def top_names(path: Path) -> frozenset[str]:
    return frozenset(_bound(ast.parse(path.read_text(), str(path))))


def _absolute(node: ast.ImportFrom, path: Path, root: Path) -> str | None:
    """The dotted module an ImportFrom names (relative imports resolved inside the package)."""
    if not node.level:
        return node.module
    pkg = path.parent   # level 1: the package this module (or __init__.py) is in
    for _ in range(node.level - 1):
        pkg = pkg.parent
    parts = list(pkg.relative_to(root).parts) + (node.module.split(".") if node.module else [])
    return ".".join(parts)


def problems(path: Path, root: Path = ROOT, source: str | None = None) -> list[str]:
    """What path refers to in bytemodel that does not exist, as 'file:line: what' lines."""
    text = path.read_text() if source is None else source
    try:
        tree = ast.parse(text, str(path))
        compile(text, str(path), "exec")
    except SyntaxError as e:
        return [f"{path}:{e.lineno}: does not compile: {e.msg}"]
    where = lambda n: f"{path.relative_to(root) if path.is_relative_to(root) else path}:{n.lineno}"
    out: list[str] = []
    modules: dict[str, set[str]] = {}    # alias -> the bytemodel modules bound to it
    others: set[str] = set()             # aliases also bound to something else
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] != "bytemodel":
                    others.add((a.asname or a.name).split(".")[0])
                    continue
                if module_file(root, a.name) is None:
                    out.append(f"{where(node)}: no module {a.name}")
                elif a.asname:
                    modules.setdefault(a.asname, set()).add(a.name)
        elif isinstance(node, ast.ImportFrom):
            mod = _absolute(node, path, root)
            if not mod or mod.split(".")[0] != "bytemodel":
                others.update(a.asname or a.name for a in node.names)
                continue
            f = module_file(root, mod)
            if f is None:
                out.append(f"{where(node)}: no module {mod}")
                continue
            for a in node.names:
                if a.name == "*":
                    continue
                sub = f"{mod}.{a.name}"
                if module_file(root, sub) is not None:
                    modules.setdefault(a.asname or a.name, set()).add(sub)
                elif a.name not in top_names(f):
                    out.append(f"{where(node)}: {mod} has no {a.name}")
                else:
                    others.add(a.asname or a.name)
    for node in ast.walk(tree):   # names bound otherwise (assignments, arguments) shadow a module alias
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            others.add(node.id)
        elif isinstance(node, ast.arg):
            others.add(node.arg)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            others.add(node.name)
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                and node.value.id in modules and node.value.id not in others and len(modules[node.value.id]) == 1):
            (mod,) = modules[node.value.id]
            if node.attr.startswith("__") or module_file(root, f"{mod}.{node.attr}") is not None:
                continue   # a module's own dunders (__file__, __name__) and its submodules
            if node.attr not in top_names(module_file(root, mod)):
                if not isinstance(node.ctx, ast.Store):   # monkeypatching a new name is the test's business
                    out.append(f"{where(node)}: {mod} has no {node.attr}")
    return out


@pytest.mark.parametrize("folder", FOLDERS)
def test_every_name_taken_from_bytemodel_exists(folder):
    found = [p for path in python_files() if path.relative_to(ROOT).parts[0] == folder for p in problems(path)]
    assert not found, "\n".join(found)


@pytest.mark.parametrize("line,what", [
    ("from bytemodel.parallel import CoreParallel", "no module bytemodel.parallel"),
    ("from bytemodel.training.runner import CoreParalel", "has no CoreParalel"),
    ("from bytemodel.ops import cuda_decode\ncuda_decode.Decodr", "has no Decodr"),
    ("import bytemodel.training.loop as loop\nloop.no_such_thing()", "has no no_such_thing"),
    ("def broken(:\n", "does not compile"),
])
def test_the_check_finds_a_missing_name(tmp_path, line, what):
    """The check itself fails on a name that is gone (an old root module, a typo, a lost attribute)."""
    f = tmp_path / "probe.py"
    f.write_text(line + "\n")
    found = problems(f)
    assert len(found) == 1 and what in found[0], found


def test_the_check_passes_names_that_exist(tmp_path):
    f = tmp_path / "probe.py"
    f.write_text("from bytemodel.training.runner import CoreParallel\nfrom bytemodel.ops import cuda_decode\n"
                 "cuda_decode.Decoder\nimport bytemodel.training.loop as loop\nloop.Loop\n")
    assert problems(f) == []
