"""The import rule (docs/ARCHITECTURE.md): data flows one way, so a module imports only modules
of LOWER layers, or parts of its own package (readers/, tokenizer/, ops/, hf/, cli/). Every import
counts, the lazy ones inside functions too. A new module must be given its layer here."""
from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "bytemodel"

# Lowest first. Within a layer nothing imports anything else (except inside one package).
LAYERS = [
    ("errors",),                                  # user errors: one line each
    ("jsonguard",),                               # user JSON: bounded nesting, no NaN
    ("fileguard", "validation"),                  # what a path may be; settings' ranges and types
    ("atomic", "resources", "config"),            # the one atomic write; gpu/ + datasets/; settings
    ("readers", "runfiles"),                      # file(s) -> byte documents -> file; run files
    ("tokenizer",),                               # bytes <-> ids
    ("catalogue", "corpus", "sampling", "chat_template", "baselines"),   # named datasets; documents ->
                                                  # token file; draws; conversations <-> ids; the
                                                  # compressors' figures
    ("pairs",),                                   # fine-tuning examples + their loss mask
    ("ops",),                                     # the op table and its backends (the device)
    ("mtp",),                                     # multi-token heads
    ("model",),                                   # the transformer over the ops
    ("gradcheck", "checkpoint"),                  # finite differences; the file format
    ("hf", "lineage", "runinfo"),                 # the Hugging Face format; a fine-tune's parent;
                                                  # what a run records about its data
    ("training", "decode"),                       # the wings: training; sampling, scoring, lockstep
    ("compress",),                                # the wing over decode (and train's optimizer)
    ("chat",),                                    # the chat REPL's engine
    ("__init__",),                                # the public Python API
    ("cli",),                                     # the command, over the API
]
RANK = {name: i for i, layer in enumerate(LAYERS) for name in layer}
PACKAGES = ("readers", "tokenizer", "ops", "hf", "cli", "training", "decode", "compress")


def component(module: str) -> str:
    """'bytemodel.readers.zstd' -> 'readers'; 'bytemodel' -> '__init__'."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def module_of(path: Path) -> str:
    parts = list(path.relative_to(PKG.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def resolve(importer: Path, node: ast.ImportFrom) -> list[str]:
    """The bytemodel modules an import-from names (a name that is a submodule counts as it)."""
    if node.level == 0:
        base = node.module or ""
    else:
        pkg = module_of(importer) if importer.name == "__init__.py" else module_of(importer).rpartition(".")[0]
        up = pkg.split(".")[:len(pkg.split(".")) - (node.level - 1)]
        base = ".".join(up + ([node.module] if node.module else []))
    if not base.startswith("bytemodel"):
        return []
    out = []
    for a in node.names:
        sub = base + "." + a.name
        rel = Path(*sub.split("."))
        is_mod = (PKG.parent / rel).with_suffix(".py").is_file() or (PKG.parent / rel / "__init__.py").is_file()
        out.append(sub if is_mod else base)
    return out


def imports():
    """(importing module, imported module, line) for every bytemodel import in the package."""
    for f in sorted(PKG.rglob("*.py")):
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.ImportFrom):
                for m in resolve(f, node):
                    yield module_of(f), m, node.lineno
            elif isinstance(node, ast.Import):
                for a in node.names:
                    if a.name.startswith("bytemodel"):
                        yield module_of(f), a.name, node.lineno


def test_every_module_has_a_layer():
    comps = {component(module_of(f)) for f in PKG.rglob("*.py")}
    assert not comps - set(RANK), f"give these a layer in tests/test_layers.py: {sorted(comps - set(RANK))}"


def test_imports_follow_the_flow():
    bad = []
    for src, dst, line in imports():
        a, b = component(src), component(dst)
        if a == b and (a in PACKAGES or src == dst):
            continue                                   # parts of one package
        if RANK.get(b, -1) >= RANK.get(a, 99):
            bad.append(f"{src}:{line} imports {dst} ({b} is not below {a})")
    assert not bad, "\n".join(bad)


def test_no_import_cycles_inside_packages():
    """Inside readers/, tokenizer/, ops/, hf/, cli/: the parts import each other without cycles."""
    graph: dict[str, set[str]] = {}
    for src, dst, _ in imports():
        if component(src) == component(dst) and src != dst and dst != src.rpartition(".")[0]:
            graph.setdefault(src, set()).add(dst)
    state: dict[str, int] = {}

    def visit(n, path):
        state[n] = 1
        for m in graph.get(n, ()):
            if state.get(m) == 1:
                raise AssertionError("import cycle: " + " -> ".join(path + [n, m]))
            if m not in state:
                visit(m, path + [n])
        state[n] = 2
    for n in list(graph):
        if n not in state:
            visit(n, [])


def test_the_rule_catches_a_back_edge(tmp_path, monkeypatch):
    """The checker itself: a tokenizer module importing the corpus is reported."""
    fake = PKG / "tokenizer" / "encode.py"
    tree_src = fake.read_text() + "\n\ndef _x():\n    from ..corpus import Corpus\n"
    real_read = Path.read_text
    monkeypatch.setattr(Path, "read_text", lambda self, *a, **k: tree_src if self == fake else real_read(self, *a, **k))
    bad = [(s, d) for s, d, _ in imports() if component(s) == "tokenizer" and component(d) == "corpus"]
    assert bad == [("bytemodel.tokenizer.encode", "bytemodel.corpus")]


def test_encoding_never_imports_tokenizer_training():
    """Encoding (tokenizer/encode.py) and its own parts stay clear of tokenizer/train.py."""
    edges = {(s, d) for s, d, _ in imports()}
    reach, todo = set(), ["bytemodel.tokenizer.encode"]
    while todo:
        n = todo.pop()
        for s, d in edges:
            if s == n and d not in reach and d != "bytemodel.tokenizer":
                reach.add(d)
                todo.append(d)
    assert "bytemodel.tokenizer.train" not in reach and "bytemodel.tokenizer.pretok" in reach
