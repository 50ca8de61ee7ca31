"""Photos and speech as a user brings them: a model trained through the CLI on most of the files,
scored on held-out files it never saw, against the lossless codecs on the same samples (issue 27).

    python benchmarks/little_data.py split OUT [--photos DIR] [--speech DIR]   # OUT/{photos,speech}/{train,held}
    python benchmarks/little_data.py codecs OUT                                # CPU: PNG, WebP, JPEG XL; FLAC -8
    python benchmarks/little_data.py model OUT --device cuda --minutes 6 [--tiles 0,16,32] [--kinds photos,speech] [--parallel]
    python benchmarks/little_data.py table OUT                                 # Markdown from OUT/*.json

Held out: the two photos of `mate-nature` that sort last (Wood, YellowFlower: where a run's own
held-out tail would fall) and two `codec2-speech` clips (mmt1.wav, vk5qi.wav); the rest is the
training folder, less codec2's all.wav (five of the clips back to back, vk5qi among them: a run
trained on it would have seen a held-out clip). DIRs default to the catalogue's folders (`bytemodel data get NAME`).

codecs: each held-out photo decoded from its JPEG to RGB pixels (the bytes the image reader
gives), then `optipng -o2` on a PNG of them, `cwebp -lossless -z 9`, `cjxl -d 0 -e 7`; each file
decoded again and compared pixel for pixel. Each clip's samples at its own rate: `flac -8
--no-padding --no-seektable` on a 16-bit mono WAV of them, decoded and compared. Figures are
bits per sample byte (file bytes x 8 / (width x height x 3) or / (samples x 2)).

model: `bytemodel train --source OUT/K/train --reader R --device D --minutes M --no-baseline -q`
with every other setting at its default, then `bytemodel score HELD -c RUN --device D` on each
held-out file; bits per sample byte charges every bit the model spends (tile headers included)
to the samples. Photos: R = image:tile=N for each N in --tiles (tile=0: whole rows);
speech: audio:encoding=pcm16 at 8000 Hz (the clips' own rate). Results: OUT/codecs.json,
OUT/model.json.
"""
from __future__ import annotations

import argparse
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HELD_PHOTOS = ("Wood.jpg", "YellowFlower.jpg")
HELD_CLIPS = ("mmt1.wav", "vk5qi.wav")
LEFT_OUT = ("all.wav",)   # codec2's all.wav is other clips back to back, the held-out vk5qi among them
SPEECH_READER = "audio:encoding=pcm16,rate=8000"


def _catalogue(name: str) -> Path:
    out = subprocess.run([sys.executable, "-m", "bytemodel.cli", "data", "get", name],
                         capture_output=True, text=True, check=True).stdout.strip().splitlines()
    return Path(out[-1])


def split(a) -> None:
    for kind, src, held in (("photos", a.photos or _catalogue("mate-nature"), HELD_PHOTOS),
                            ("speech", a.speech or _catalogue("codec2-speech"), HELD_CLIPS)):
        src = Path(src)
        for part in ("train", "held"):
            (a.out / kind / part).mkdir(parents=True, exist_ok=True)
        files = sorted(p for p in src.iterdir() if p.is_file() and not p.name.startswith(".") and p.name not in LEFT_OUT)
        for p in files:
            shutil.copy2(p, a.out / kind / ("held" if p.name in held else "train") / p.name)
        print(f"{kind}: {len(files) - len(held)} to train on, held out {', '.join(held)}")


def _run(cmd, **kw):
    t = time.time()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, **kw)
    return time.time() - t


def photo_codecs(path: Path, tmp: Path) -> dict:
    import numpy as np
    from PIL import Image
    px = np.asarray(Image.open(path).convert("RGB"))
    n = px.size
    png = tmp / "x.png"
    Image.fromarray(px).save(png, compress_level=9)
    row = {"file": path.name, "width": px.shape[1], "height": px.shape[0], "sample_bytes": n}
    for name, cmd, out, back in (
            ("PNG (optipng -o2)", ["optipng", "-quiet", "-o2", "-out", str(tmp / "o.png"), str(png)], tmp / "o.png", None),
            ("WebP lossless (-z 9)", ["cwebp", "-quiet", "-lossless", "-z", "9", str(png), "-o", str(tmp / "x.webp")],
             tmp / "x.webp", ["dwebp", "-quiet", str(tmp / "x.webp"), "-o", str(tmp / "w.png")]),
            ("JPEG XL lossless (-e 7)", ["cjxl", "--quiet", "-d", "0", "-e", "7", str(png), str(tmp / "x.jxl")],
             tmp / "x.jxl", ["djxl", "--quiet", str(tmp / "x.jxl"), str(tmp / "j.png")])):
        secs = _run(cmd)
        if back:
            _run(back)
            decoded = Path(back[-1])
        else:
            decoded = out
        same = np.array_equal(np.asarray(Image.open(decoded).convert("RGB")), px)
        if not same:
            raise SystemExit(f"{name} did not give {path.name}'s pixels back")
        size = out.stat().st_size
        row[name] = {"bytes": size, "bits_per_byte": 8 * size / n, "seconds": round(secs, 1)}
    return row


def clip_codecs(path: Path, tmp: Path) -> dict:
    import numpy as np
    import soundfile as sf
    from bytemodel.readers import get_reader
    samples = np.frombuffer(b"".join(get_reader(SPEECH_READER).read(path)), dtype="<i2")
    wav = tmp / "x.wav"
    sf.write(wav, samples, 8000, subtype="PCM_16")
    secs = _run(["flac", "-8", "--no-padding", "--no-seektable", "-f", "-s", "-o", str(tmp / "x.flac"), str(wav)])
    _run(["flac", "-d", "-f", "-s", "-o", str(tmp / "y.wav"), str(tmp / "x.flac")])
    back, _ = sf.read(tmp / "y.wav", dtype="int16")
    if not np.array_equal(back, samples):
        raise SystemExit(f"FLAC did not give {path.name}'s samples back")
    size = (tmp / "x.flac").stat().st_size
    return {"file": path.name, "samples": int(samples.size), "sample_bytes": 2 * int(samples.size),
            "FLAC -8": {"bytes": size, "bits_per_byte": 8 * size / (2 * samples.size), "seconds": round(secs, 1)}}


def codecs(a) -> None:
    res = {"photos": [], "speech": []}
    with tempfile.TemporaryDirectory() as t:
        for i, p in enumerate(sorted((a.out / "photos" / "held").iterdir())):
            (Path(t) / str(i)).mkdir()
            res["photos"].append(photo_codecs(p, Path(t) / str(i)))
            print(json.dumps(res["photos"][-1]), flush=True)
        for i, p in enumerate(sorted((a.out / "speech" / "held").iterdir())):
            (Path(t) / f"s{i}").mkdir()
            res["speech"].append(clip_codecs(p, Path(t) / f"s{i}"))
            print(json.dumps(res["speech"][-1]), flush=True)
    (a.out / "codecs.json").write_text(json.dumps(res, indent=1))


SCORE = re.compile(r": ([0-9.]+) bits/byte \(([0-9]+) bits for ([0-9,]+) bytes")


def _bm(*args) -> str:
    p = subprocess.run([sys.executable, "-m", "bytemodel.cli", *map(str, args)], capture_output=True, text=True)
    if p.returncode:
        raise SystemExit(f"bytemodel {' '.join(map(str, args))} failed:\n{p.stdout}{p.stderr}")
    return p.stdout + p.stderr


def _best(run: Path) -> dict:
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]
    val = [(r["val_bpb"], r["step"]) for r in rows if r.get("val_bpb") is not None]
    b = min(val)
    return {"best_val": b[0], "best_step": b[1], "steps": rows[-1]["step"], "epoch": rows[-1].get("epoch")}


def model(a) -> None:
    out = a.out / "model.json"
    res = json.loads(out.read_text()) if out.exists() else []
    codec = json.loads((a.out / "codecs.json").read_text()) if (a.out / "codecs.json").exists() else {}
    sample_bytes = {r["file"]: r["sample_bytes"] for k in codec.values() for r in k}
    jobs = []
    if "photos" in a.kinds:
        jobs += [("photos", f"image:tile={int(n)}") for n in a.tiles.split(",")]   # tile=0: whole rows
    if "speech" in a.kinds:
        jobs.append(("speech", SPEECH_READER))
    def train_cmd(kind, reader, run):
        return [sys.executable, "-m", "bytemodel.cli", "train", "--source", str(a.out / kind / "train"),
                "--reader", reader, "--device", a.device, "--minutes", str(a.minutes), "--no-baseline", "-q",
                "--out", str(run), *a.extra.split()]

    runs = [(kind, reader, a.out / "runs" / f"{kind}_{reader.replace(':', '_').replace('=', '').replace(',', '_')}")
            for kind, reader in jobs]
    logs, walls = {}, {}
    if a.parallel:      # every run at once, sharing the device (equal shares, not equal to one alone)
        t = time.time()
        (a.out / "runs").mkdir(parents=True, exist_ok=True)
        procs = []
        for k, r, run in runs:      # each log written as the run goes (a cut call keeps it): RUN.log
            with open(f"{run}.log", "w") as f:
                procs.append((run, subprocess.Popen(train_cmd(k, r, run), stdout=f, stderr=subprocess.STDOUT)))
        for run, p in procs:
            p.wait()
            logs[run] = Path(f"{run}.log").read_text()
            walls[run] = round(time.time() - t)
            if p.returncode:
                raise SystemExit(f"training {run} failed:\n{logs[run]}")
    scores = {}
    if a.parallel:      # every held-out file under every run at once too (one at a time took minutes)
        jobs = [(run, held) for kind, _, run in runs for held in sorted((a.out / kind / "held").iterdir())]
        procs = []
        for j in jobs:      # each score's line written as it comes (a cut call keeps those done): RUN.HELD.score
            log = Path(f"{j[0]}.{j[1].name}.score")
            with open(log, "w") as f:
                procs.append((j, log, subprocess.Popen([sys.executable, "-m", "bytemodel.cli", "score", str(j[1]), "-c",
                                                        str(j[0]), "--device", a.device], stdout=f, stderr=subprocess.STDOUT)))
        for j, log, p in procs:
            p.wait()
            scores[j] = log.read_text()
            print(f"{j[1].name} under {j[0].name}: {scores[j].strip()}", flush=True)
            if p.returncode:
                raise SystemExit(f"scoring {j[1]} with {j[0]} failed:\n{scores[j]}")
    for kind, reader, run in runs:
        if run not in logs:
            t = time.time()
            logs[run] = _bm(*train_cmd(kind, reader, run)[3:])
            walls[run] = round(time.time() - t)
        row = {"kind": kind, "reader": reader, "minutes": a.minutes, "parallel": a.parallel, "wall_s": walls[run],
               "run": _best(run), "train_log": logs[run].splitlines()[:2], "held": []}
        for held in sorted((a.out / kind / "held").iterdir()):
            m = SCORE.search(scores.get((run, held)) or _bm("score", held, "-c", run, "--device", a.device))
            bits, n = int(m.group(2)), int(m.group(3).replace(",", ""))
            row["held"].append({"file": held.name, "bits": bits, "scored_bytes": n, "bits_per_byte": bits / n,
                                "bits_per_sample_byte": bits / sample_bytes.get(held.name, n)})
            print(json.dumps({"run": str(run), **row["held"][-1]}), flush=True)   # each score as it comes
        res.append(row)
        print(json.dumps(row), flush=True)
        out.write_text(json.dumps(res, indent=1))


def table(a) -> None:
    codec = json.loads((a.out / "codecs.json").read_text())
    runs = json.loads((a.out / "model.json").read_text()) if (a.out / "model.json").exists() else []
    for kind, names in (("photos", ("PNG (optipng -o2)", "WebP lossless (-z 9)", "JPEG XL lossless (-e 7)")),
                        ("speech", ("FLAC -8",))):
        models = [r for r in runs if r["kind"] == kind]
        head = ["file", *names, *(f"model, {r['reader']}" for r in models)]
        print("| " + " | ".join(head) + " |\n|" + "---|" * len(head))
        for c in codec[kind]:
            cells = [c["file"]] + [f"{c[n]['bits_per_byte']:.3f}" for n in names]
            for r in models:
                h = next((h for h in r["held"] if h["file"] == c["file"]), None)
                cells.append(f"{h['bits_per_sample_byte']:.3f}" if h else "-")
            print("| " + " | ".join(cells) + " |")
        print()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="what", required=True)
    for name in ("split", "codecs", "model", "table"):
        p = sub.add_parser(name)
        p.add_argument("out", type=Path)
        if name == "split":
            p.add_argument("--photos")
            p.add_argument("--speech")
        if name == "model":
            p.add_argument("--device", default="cuda")
            p.add_argument("--minutes", type=float, default=6)
            p.add_argument("--tiles", default="0,16,32", help="comma-separated tile sides, 0 = whole rows")
            p.add_argument("--kinds", default="photos,speech")
            p.add_argument("--extra", default="", help="more train flags, space-separated")
            p.add_argument("--parallel", action="store_true", help="train every run at once (sharing the device)")
    a = ap.parse_args()
    {"split": split, "codecs": codecs, "model": model, "table": table}[a.what](a)


if __name__ == "__main__":
    main()
