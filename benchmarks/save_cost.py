"""What a validation's checkpoint writes cost the training loop: written in the loop's thread (as
before training/saver.py) against handed to the saver's thread, for one preset's weights and
moments (the resume checkpoint) plus the weights alone (best.safetensors), in one run.

    python benchmarks/save_cost.py [--preset base] [--rounds 3] [--dir /tmp]

Prints per round the seconds the loop is held: writing both files itself, and submitting both to
a Saver (snapshot copies included, as the loop makes them on the NumPy backend), then the
seconds until the saver's writes are on disk. Both write the same two files to --dir.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bytemodel import checkpoint as ckpt  # noqa: E402
from bytemodel.config import preset  # noqa: E402
from bytemodel.model import n_params  # noqa: E402
from bytemodel.tokenizer import Tokenizer  # noqa: E402
from bytemodel.training.saver import Saver  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="base")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dir", default="/tmp")
    a = ap.parse_args()
    cfg, tok = preset(a.preset, 257), Tokenizer()
    n = n_params(cfg)
    rng = np.random.default_rng(0)
    p, m, v = (rng.standard_normal(n, dtype=np.float32) for _ in range(3))
    d = Path(a.dir)
    rows = []
    for r in range(a.rounds):
        t = time.perf_counter()
        ckpt.save(d / "save_cost_ckpt.safetensors", cfg, tok, p, {"step": r}, m, v)
        ckpt.save(d / "save_cost_best.safetensors", cfg, tok, p, {"step": r, "best": True})
        inline = time.perf_counter() - t
        s = Saver()
        t = time.perf_counter()
        pc, mc, vc = p.copy(), m.copy(), v.copy()
        s.submit(ckpt.save, d / "save_cost_ckpt.safetensors", cfg, tok, pc, {"step": r}, mc, vc)
        s.submit(ckpt.save, d / "save_cost_best.safetensors", cfg, tok, pc, {"step": r, "best": True})
        held = time.perf_counter() - t
        s.close()
        landed = time.perf_counter() - t
        rows.append({"preset": a.preset, "params": n, "inline_s": round(inline, 3), "saver_held_s": round(held, 3),
                     "saver_landed_s": round(landed, 3), "ratio": round(inline / max(held, 1e-9), 1)})
        print(json.dumps(rows[-1]), flush=True)
    for f in ("save_cost_ckpt.safetensors", "save_cost_best.safetensors"):
        (d / f).unlink(missing_ok=True)


if __name__ == "__main__":
    main()
