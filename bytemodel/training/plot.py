"""Loss curves: every run's loss.png, and `bytemodel plot RUN...` to overlay several runs.

Drawn with matplotlib (imported here only, on first use, with the non-interactive Agg canvas, so
no display is needed and nothing else in bytemodel pays for the import). A run's curve comes from
its metrics.jsonl: training bits/byte (a running mean, as single steps are noisy) and validation
bits/byte against steps, the best validation marked; the compressors' figures on the same held-out
tail (zstd -19, xz -9e; baselines.json, measured once per run) are horizontal lines.
"""
from __future__ import annotations

import io
import json
import math
from pathlib import Path

from ..atomic import write_atomic
from ..errors import ConfigError

LOSS_PNG = "loss.png"
BASELINES_FILE = "baselines.json"


def read_metrics(run_dir: str | Path) -> list[dict]:
    """The records of a run's metrics.jsonl (later records of a step replace earlier ones)."""
    p = Path(run_dir) / "metrics.jsonl"
    try:
        text = p.read_text()
    except OSError:
        raise ConfigError(f"{run_dir} has no metrics.jsonl (not a training run?)") from None
    by_step = {}
    for line in text.splitlines():
        try:
            d = json.loads(line)
        except ValueError:
            continue          # a line cut by a crash
        if isinstance(d, dict) and "step" in d:
            by_step[d["step"]] = d
    return [by_step[k] for k in sorted(by_step)]


def run_baselines(run_dir: str | Path, tc) -> dict:
    """zstd -19 / xz -9e bits/byte on the run's data (whole stream and held-out tail), cached in
    run_dir/baselines.json."""
    p = Path(run_dir) / BASELINES_FILE
    try:
        return json.loads(p.read_text())
    except (OSError, ValueError):
        pass
    from ..baselines import source_baselines
    b = source_baselines(tc.source, tc.reader or None, tc.val_fraction)
    b = {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in b.items()}
    write_atomic(p, json.dumps(b).encode())
    return b


def _baselines(run_dir: Path) -> dict:
    try:
        return json.loads((run_dir / BASELINES_FILE).read_text())
    except (OSError, ValueError):
        return {}


def _smooth(values: list[float], n: int) -> list[float]:
    out, acc, window = [], 0.0, []
    for v in values:
        window.append(v)
        acc += v
        if len(window) > n:
            acc -= window.pop(0)
        out.append(acc / len(window))
    return out


def _draw(ax, run_dir: Path, color, label: str, train: bool = True) -> list[float]:
    rows = read_metrics(run_dir)
    tr = [(r["step"], r["bpb"]) for r in rows if r.get("bpb") is not None]
    va = [(r["step"], r["val_bpb"]) for r in rows if r.get("val_bpb") is not None]
    if train and tr:
        xs, ys = zip(*tr)
        ax.plot(xs, _smooth(list(ys), max(1, len(ys) // 50)), color=color, alpha=0.45, lw=1,
                label=f"{label} train (running mean)")
    if va:
        xs, ys = zip(*va)
        ax.plot(xs, ys, "o-", color=color, ms=3, lw=1.5, label=f"{label} validation")
        i = min(range(len(ys)), key=ys.__getitem__)
        ax.plot([xs[i]], [ys[i]], "*", color=color, ms=12, mec="black", mew=0.5,
                label=f"{label} best {ys[i]:.4f} (step {xs[i]})")
    return [y for _, y in va] + [y for _, y in tr]


def _figure(run_dirs: list[Path], title: str):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    fig = Figure(figsize=(8, 5), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    colors = ["C0", "C1", "C2", "C3", "C4", "C5", "C6", "C7", "C8", "C9"]
    seen, vals = set(), []
    for i, d in enumerate(run_dirs):
        label = d.name if len(run_dirs) > 1 else ""
        vals += _draw(ax, d, colors[i % len(colors)], label.strip(), train=True)
        b = _baselines(d)
        for key, name, style in (("zstd19_tail", "zstd -19", "--"), ("xz9_tail", "xz -9e", ":")):
            v = b.get(key)
            if v is not None and (key, round(v, 4)) not in seen:
                seen.add((key, round(v, 4)))
                ax.axhline(v, color="gray", ls=style, lw=1.2, label=f"{name} on the held-out tail: {v:.3f}")
                vals.append(v)
    finite = sorted(v for v in vals if v is not None and math.isfinite(v))
    if finite:   # keep the first steps' high loss from flattening the interesting part
        lo, hi = finite[0], finite[min(len(finite) - 1, int(len(finite) * 0.9))]
        ax.set_ylim(lo - 0.05 * (hi - lo + 1e-3), hi + 0.15 * (hi - lo + 1e-3))
    ax.set_xlabel("step")
    ax.set_ylabel("bits per byte")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper right")
    fig.subplots_adjust(left=0.09, right=0.98, bottom=0.1, top=0.93)
    return fig


FORMATS = ("png", "svg", "pdf")   # what `plot --out` writes, by the name's extension


def _format(out: Path) -> str:
    """The image format an output name asks for (its extension), refused before any drawing where
    it is not one of FORMATS (a chart is never written as PNG under another format's name)."""
    ext = out.suffix.lower().lstrip(".")
    if ext not in FORMATS:
        raise ConfigError(f"{out}: give a name ending in .png, .svg or .pdf (the chart's format)")
    return ext


def _save(fig, out: Path, fmt: str = "png") -> Path:
    buf = io.BytesIO()
    fig.savefig(buf, format=fmt)
    return write_atomic(out, buf.getvalue())


def write_loss_png(run_dir: str | Path) -> Path:
    """Draw run_dir/loss.png from its metrics (and baselines, where measured)."""
    run_dir = Path(run_dir)
    return _save(_figure([run_dir], f"{run_dir.name}: bits per byte"), run_dir / LOSS_PNG)


def plot_runs(run_dirs: list[str | Path], out: str | Path) -> Path:
    """Overlay the runs' curves in one chart: PNG, SVG or PDF by `out`'s extension."""
    fmt = _format(Path(out))
    dirs = [Path(d) for d in run_dirs]
    if not dirs:
        raise ConfigError("give at least one run directory")
    for d in dirs:
        if not (d / "metrics.jsonl").exists():
            raise ConfigError(f"{d} has no metrics.jsonl (not a training run?)")
    return _save(_figure(dirs, "bits per byte: " + ", ".join(d.name for d in dirs)), Path(out), fmt)
