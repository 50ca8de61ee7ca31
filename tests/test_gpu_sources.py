"""Only kernels that run ship: every kernel in gpu/*.cu is named by a launch site in ops/, and
every kernel name ops/ launches exists. Read from the sources, so it runs without a GPU."""
from __future__ import annotations

import ast
import re
from pathlib import Path

from bytemodel.resources import gpu_dir

OPS_DIR = Path(__file__).resolve().parents[1] / "bytemodel" / "ops"


def _ops_trees():
    """The Python sources that launch kernels: every module of ops/."""
    return [ast.parse(f.read_text()) for f in sorted(OPS_DIR.glob("*.py"))]


KERNEL = r'extern "C" __global__ void (?:__launch_bounds__\([^()]*(?:\([^()]*\))?[^()]*\) )?(\w+?)(##\w+)?\('


def shipped_kernels() -> set[str]:
    names = set()
    for f in gpu_dir().glob("*.cu"):
        src = f.read_text()
        # kernels made by one-parameter macros: #define M(A) ... kernel prefix##A ...; M(1) M(2) ...
        for m in re.finditer(r"^#define (\w+)\((\w+)\)((?:.*\\\n)+.*)", src, re.M):
            mac, arg, body = m.groups()
            prefixes = [p for p, tail in re.findall(KERNEL, body) if tail == "##" + arg]
            for val in re.findall(rf"^{mac}\((\w+)\)", src, re.M):
                names |= {p + val for p in prefixes}
        # kernels named by a macro's first parameter: #define M(NAME, ...) ... kernel NAME(; M(x, ...)
        macro_params = set()
        for m in re.finditer(r"^#define (\w+)\((\w+),[^)]*\)((?:.*\\\n)+.*)", src, re.M):
            mac, arg, body = m.groups()
            if any(p == arg and not tail for p, tail in re.findall(KERNEL, body)):
                macro_params.add(arg)
                names |= set(re.findall(rf"^{mac}\((\w+),", src, re.M))
        names |= {p for p, tail in re.findall(KERNEL, src) if not tail and p not in macro_params}
    return names


def launched_patterns() -> list[re.Pattern]:
    """Every string in ops/*.py, f-strings as patterns ({...} matches a name part)."""
    pats = []
    for node in (n for t in _ops_trees() for n in ast.walk(t)):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            pats.append(re.compile(re.escape(node.value)))
        elif isinstance(node, ast.JoinedStr):
            parts = [re.escape(v.value) if isinstance(v, ast.Constant) else r"\w+" for v in node.values]
            pats.append(re.compile("".join(parts)))
    return pats


def test_every_shipped_kernel_is_launched():
    kernels = shipped_kernels()
    assert {"adamw_step", "flash_fwd_d64", "flash_bwd_d128", "rmsnorm_bwd_r3", "flash_fwd_h64_bs"} <= kernels  # the parser works
    assert "NAME" not in kernels
    pats = launched_patterns()
    unused = sorted(k for k in kernels if not any(p.fullmatch(k) for p in pats))
    assert not unused, f"kernels no code path launches (move them to benchmarks/kernels/): {unused}"


def test_every_launched_kernel_exists():
    kernels = shipped_kernels()
    calls = []
    for node in (n for t in _ops_trees() for n in ast.walk(t)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr in ("_fn", "get_function") and node.args:
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


def test_hopper_backward_shared_memory_matches_its_mode():
    """cuda_ops sizes the Hopper backward's shared memory from FLASH_BWD_HOPPER's exchange floats;
    the kernel places lse and delta after an exchange its MODE decides (flash_bwd_h's sX: 128 D with
    PIPE, none with SPLIT, else 64 D). A kernel shipped with another MODE than the table assumes
    would read and write past its allocation, so the table is held to the source here (the
    dropout twin too, which must share the plain kernel's MODE). The table is read from
    cuda_ops.py's source (importing it needs CuPy)."""
    tree = ast.parse((OPS_DIR / "cuda_ops.py").read_text())
    node = next(n.value for n in tree.body if isinstance(n, ast.Assign)
                and any(getattr(t, "id", None) == "FLASH_BWD_HOPPER" for t in n.targets))
    FLASH_BWD_HOPPER = eval(compile(ast.Expression(node), "cuda_ops.py", "eval"), {})   # literals and products
    src = (gpu_dir() / "flash_hopper.cu").read_text()
    for D, (name, tiles) in FLASH_BWD_HOPPER.items():
        m = re.search(rf"^BWD_H\({name}, (\d+), (\d+), (\d+)\)", src, re.M)
        md = re.search(rf"^BWD_H_DROP\({name}_drop, (\d+), (\d+), (\d+), \d+\)", src, re.M)
        assert m and md, name
        d, bm, mode = (int(x) for x in m.groups())
        assert (d, bm) == (D, tiles[0]) and tuple(int(x) for x in md.groups()) == (d, bm, mode), name
        exchange = 128 * D if mode & 128 else 0 if mode & 256 else 64 * D
        assert tiles[3] == exchange, (name, mode, tiles)
