"""Shared steps of the example scripts: fetch data, train briefly, generate, write, compare.

Every example does the same five things on real data:
1. get the data (`bytemodel.catalogue.get`: shipped sample or installed Debian package),
2. train a tiny model for a few hundred steps (`bytemodel.train`),
3. generate bytes and write them in the data's own format (`write_output`: .fa, .png, .wav, ...),
4. measure what zstd -19 and xz -9e achieve on the same byte stream the model was trained on,
5. print validation bits/byte beside them, and save the figures to <out>/result.json.

Compressors are given two figures: on the whole stream (what `zstd -19 FILE` would do) and on the
held-out tail given the rest (8 * (C(all) - C(train)) / len(tail)), which is what the model's
validation bits/byte measures: the cost of the tail bytes, having seen the training bytes.

Each script accepts --steps N (or the environment variable BYTEMODEL_EXAMPLE_STEPS) to make a
quick smoke test, and --out DIR for its run directory and outputs; BYTEMODEL_EXAMPLE_GEN_BYTES caps
how many bytes are generated (tests/test_examples.py sets both).
"""
from __future__ import annotations

import argparse
import json
import lzma
import os
import shutil
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # run from a checkout without installing

import bytemodel  # noqa: E402
from bytemodel.errors import BytemodelError  # noqa: E402
from bytemodel.readers import read_documents, write_output  # noqa: E402

VAL_FRACTION = 0.1  # the trainer's default held-out tail
BATCH = 8           # windows of 256 bytes per step: 300 steps = 614k bytes seen, ~4 min on 2 cores


MARK = ".bytemodel-example"   # in an output folder an example made: its run folders are the examples' to replace


class _Parser(argparse.ArgumentParser):
    """argparse with a usage mistake as one line, as the bytemodel command says it (argparse prints
    the usage line, then `dna.py: error: ...`)."""

    def error(self, message):
        sys.stderr.write(f"error: {message} ('{self.prog} --help' lists the options)\n")
        sys.exit(2)


def parse_args(description: str, steps: int) -> argparse.Namespace:
    env = os.environ.get("BYTEMODEL_EXAMPLE_STEPS")
    try:
        default = int(env) if env else steps
    except ValueError:
        sys.exit(f"error: BYTEMODEL_EXAMPLE_STEPS must be a whole number, got {env!r}")
    p = _Parser(description=description)
    p.add_argument("--steps", type=int, default=default,
                   help=f"training steps (default {steps}; env BYTEMODEL_EXAMPLE_STEPS)")
    p.add_argument("--out", type=Path, default=None, help="output folder [default: runs/examples/<name>]")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args()


def out_dir(args, name: str, fresh: tuple[str, ...] = ("run",)) -> Path:
    """The output folder, its run folders (`fresh`) removed so each example run starts fresh, but
    only where an example made the folder (its mark, or the result.json of one made before the
    mark): a --out that holds the user's own run of that name is refused, never emptied."""
    d = args.out or Path("runs") / "examples" / name
    if d.exists() and not d.is_dir():
        sys.exit(f"error: --out {d} is a file; give a folder")
    old = [d / f for f in fresh if (d / f).exists()]
    if old and not ((d / MARK).exists() or (d / "result.json").exists()):
        sys.exit(f"error: {old[0]} exists and no example made it; give another --out (nothing was removed)")
    for f in old:
        shutil.rmtree(f)
    d.mkdir(parents=True, exist_ok=True)
    (d / MARK).touch()
    args.out_dir = d
    return d


def fetch(name: str) -> Path:
    """A catalogue dataset's folder, or exit with the one-line reason (e.g. which package to install)."""
    try:
        from bytemodel import catalogue as datasets
        return datasets.get(name)
    except BytemodelError as e:
        sys.exit(f"error: {e}")


def stream_of(source, reader) -> bytes:
    """The byte stream the trainer sees (documents back to back, separators aside)."""
    return b"".join(read_documents(source, reader))


def compressor_bpb(data: bytes, val_fraction: float = VAL_FRACTION) -> dict:
    """bits/byte of zstd -19 and xz -9e on all of ``data`` and on its tail given the head."""
    import zstandard
    split = len(data) - int(len(data) * val_fraction)
    head, tail = data[:split], data[split:]
    zc = lambda b: len(zstandard.ZstdCompressor(level=19).compress(b))  # noqa: E731
    xc = lambda b: len(lzma.compress(b, preset=9 | lzma.PRESET_EXTREME))  # noqa: E731
    z_all, x_all = zc(data), xc(data)
    return {"bytes": len(data),
            "zstd19": 8 * z_all / len(data), "xz9": 8 * x_all / len(data),
            "zstd19_tail": 8 * (z_all - zc(head)) / len(tail), "xz9_tail": 8 * (x_all - xc(head)) / len(tail)}


def train(source, reader: str, args, out: Path, **settings):
    t = time.time()
    try:
        # the examples' figures were measured on 32768 validation tokens; they measure the
        # compressors themselves (compressor_bpb), so the run does not do it a second time
        settings = {"batch_size": BATCH, "eval_tokens": 32768, "baseline": False, **settings}
        result = bytemodel.train(str(source), out_dir=str(out / "run"), reader=reader, preset="tiny",
                                 steps=args.steps, seed=args.seed, eval_every=max(1, args.steps),
                                 log=lambda m: print(m, flush=True), **settings)
    except BytemodelError as e:
        sys.exit(f"error: {e}")
    print(f"trained {result.step} steps in {time.time() - t:.0f} s: validation {result.val_bpb:.3f} bits/byte")
    return result, time.time() - t


def generate(result, n_bytes: int, prompt: bytes = b"", seed: int = 1, temperature: float = 1.0,
             **kw) -> bytes:
    cap = os.environ.get("BYTEMODEL_EXAMPLE_GEN_BYTES")  # smoke tests: generate less
    n_bytes = min(n_bytes, int(cap)) if cap else n_bytes
    lm = bytemodel.load(result.run_dir)
    return lm.generate(n_bytes, prompt=prompt, temperature=temperature, seed=seed, **kw)


def write(data: bytes, path: Path, fmt: str | None = None) -> Path:
    p = write_output(data, path, fmt)
    print(f"wrote {p} ({p.stat().st_size:,} bytes)")
    return p


def summary_lines(steps: int, val_bpb: float, c: dict) -> list[str]:
    """The summary's rows (bits/byte), each column starting at the same place on every row."""
    rows = [(f"model (tiny, {steps} steps)", "validation", val_bpb, "bits/byte"),
            ("zstd -19", "whole stream", c["zstd19"], f"tail given head {c['zstd19_tail']:.3f}"),
            ("xz -9e", "whole stream", c["xz9"], f"tail given head {c['xz9_tail']:.3f}")]
    w0, w1 = (max(len(r[i]) for r in rows) for i in (0, 1))
    return [f"  {a:<{w0}}  {b:<{w1}}  {v:6.3f}   {t}" for a, b, v, t in rows]


def report(name: str, data_name: str, reader: str, result, seconds: float, stream: bytes, output: Path,
           args) -> dict:
    c = compressor_bpb(stream)
    row = {"example": name, "data": data_name, "reader": reader, "steps": result.step,
           "train_seconds": round(seconds), "model_val_bpb": result.val_bpb, **c, "output": str(output)}
    print(f"\n{name}: {c['bytes']:,} bytes of {data_name} (reader {reader})")
    for line in summary_lines(result.step, result.val_bpb, c):
        print(line)
    (args.out_dir / "result.json").write_text(json.dumps({**row, "time": time.strftime("%Y-%m-%d %H:%M")},
                                                         indent=1) + "\n")
    return row
