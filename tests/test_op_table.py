"""The op table (bytemodel.ops.OPS) is the only place the device shows: both backends define
exactly its names, and nothing above ops/ asks a backend which device it is."""
from __future__ import annotations

import ast
import inspect
import types
from pathlib import Path

from bytemodel import ops
from bytemodel.ops import numpy_ops

PKG = Path(ops.__file__).resolve().parents[1]


def test_numpy_backend_defines_exactly_the_table():
    funcs = {n for n, f in vars(numpy_ops).items()
             if isinstance(f, types.FunctionType) and f.__module__ == numpy_ops.__name__ and not n.startswith("_")}
    assert funcs == set(ops.OPS) | set(ops.REFERENCE_ONLY)
    for a in ops.ATTRIBUTES:
        assert hasattr(numpy_ops, a), a


def test_cuda_backend_defines_exactly_the_table():
    """Read from the source with ast, so it runs without CuPy or a GPU."""
    tree = ast.parse((PKG / "ops" / "cuda_ops.py").read_text())
    (cls,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "CudaBackend"]
    methods = {n.name for n in cls.body if isinstance(n, ast.FunctionDef) and not n.name.startswith("_")}
    attrs = {t.id for n in cls.body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)}
    assert methods == set(ops.OPS)
    assert set(ops.ATTRIBUTES) <= attrs


def test_signatures_match_the_reference():
    """Same argument names, in the same order, as the NumPy reference (self aside)."""
    tree = ast.parse((PKG / "ops" / "cuda_ops.py").read_text())
    (cls,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "CudaBackend"]
    cuda = {n.name: [a.arg for a in n.args.args[1:]] + ([f"*{n.args.vararg.arg}"] if n.args.vararg else [])
            for n in cls.body if isinstance(n, ast.FunctionDef)}
    for name in ops.OPS:
        sig = inspect.signature(getattr(numpy_ops, name))
        ref = [("*" if p.kind is p.VAR_POSITIONAL else "") + p.name for p in sig.parameters.values()]
        got = cuda[name]
        # a GPU op may ignore a CPU-only tuning argument at the end (attention's block size)
        assert got[:len(ref)] == ref or got == ref[:len(got)] and ref[len(got):] == ["block"], (name, ref, got)


def test_no_device_probes_outside_ops():
    """No getattr(ops, ...) / hasattr on a backend, no test of its name, outside ops/."""
    bad = []
    for f in PKG.rglob("*.py"):
        if "ops" in f.relative_to(PKG).parts[:1]:
            continue
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "hasattr"):
                first = ast.unparse(node.args[0]) if node.args else ""
                if first in ("ops", "o", "self.ops", "model.ops", "self.model.ops", "runner.model.ops"):
                    bad.append(f"{f.name}:{node.lineno} {ast.unparse(node)}")
            if isinstance(node, ast.Compare) and ast.unparse(node.left).endswith("ops.name"):
                bad.append(f"{f.name}:{node.lineno} {ast.unparse(node)}")
    assert not bad, bad
