"""Only kernels that run ship: every kernel in gpu/*.cu is launched by cuda_ops.py, and every
kernel name cuda_ops.py launches exists. Read from the sources, so it runs without a GPU."""
from __future__ import annotations

import ast
import re
from pathlib import Path

from bytemodel.resources import gpu_dir

OPS_FILE = Path(__file__).resolve().parents[1] / "bytemodel" / "ops" / "cuda_ops.py"


def shipped_kernels() -> set[str]:
    names = set()
    for f in gpu_dir().glob("*.cu"):
        src = f.read_text()
        macros = {}   # one-parameter macros that define kernels, e.g. RMS_BWD_REG(n) -> rmsnorm_bwd_r##n
        for m in re.finditer(r"#define (\w+)\((\w+)\)\s*\\\s*\n\s*extern \"C\" __global__ void (\w+)##\2", src):
            macros[m.group(1)] = m.group(3)
        names |= set(re.findall(r'extern "C" __global__ void (?:__launch_bounds__\([^)]*\) )?(\w+)\(', src))
        for mac, prefix in macros.items():
            names |= {prefix + arg for arg in re.findall(rf"^{mac}\((\w+)\)", src, re.M)}
    return names


def launched_patterns() -> list[re.Pattern]:
    """Every string in cuda_ops.py, f-strings as patterns ({...} matches a name part)."""
    pats = []
    for node in ast.walk(ast.parse(OPS_FILE.read_text())):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            pats.append(re.compile(re.escape(node.value)))
        elif isinstance(node, ast.JoinedStr):
            parts = [re.escape(v.value) if isinstance(v, ast.Constant) else r"\w+" for v in node.values]
            pats.append(re.compile("".join(parts)))
    return pats


def test_every_shipped_kernel_is_launched():
    kernels = shipped_kernels()
    assert {"adamw_step", "flash_fwd_d64", "flash_bwd_d128", "rmsnorm_bwd_r3"} <= kernels  # the parser works
    pats = launched_patterns()
    unused = sorted(k for k in kernels if not any(p.fullmatch(k) for p in pats))
    assert not unused, f"kernels no code path launches (move them to benchmarks/kernels/): {unused}"


def test_every_launched_kernel_exists():
    kernels = shipped_kernels()
    calls = []
    for node in ast.walk(ast.parse(OPS_FILE.read_text())):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "_fn":
            calls.append(node.args[0])
    names, patterns = set(), []
    for a in calls:
        inside_f = {id(c) for j in ast.walk(a) if isinstance(j, ast.JoinedStr) for c in ast.walk(j)}
        for c in ast.walk(a):
            if isinstance(c, ast.JoinedStr):
                patterns.append("".join(re.escape(v.value) if isinstance(v, ast.Constant) else r"\w+"
                                        for v in c.values))
            elif isinstance(c, ast.Constant) and isinstance(c.value, str) and id(c) not in inside_f \
                    and re.fullmatch(r"\w+", c.value):
                names.add(c.value)
    assert len(names) > 15 and not (names - kernels), sorted(names - kernels)
    for p in patterns:   # f"flash_{kind}_d{D}", f"rmsnorm_bwd_r{...}"
        assert any(re.fullmatch(p, k) for k in kernels), p
