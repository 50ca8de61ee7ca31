"""Copy the first files of a tree, in path order, up to a share of its bytes: a smaller source whose
held-out tail is still the last files the reader takes (the text reader's order), for runs that
should read their data many times over in a short budget.

    python benchmarks/tree_head.py "$(bytemodel data get linux-docs)" .dev/data/ld-half --share 0.5

Files are hard-linked where the file system allows, else copied; sizes are the files' own bytes
(gzip-compressed documents count compressed). Prints the files and bytes taken.
"""
import argparse
import os
import shutil
from pathlib import Path


def head(src: Path, dst: Path, share: float) -> tuple[int, int]:
    files = sorted(p.relative_to(src) for p in src.rglob("*") if p.is_file())
    total = sum((src / f).stat().st_size for f in files)
    taken = n = 0
    for f in files:
        if taken >= share * total:
            break
        (dst / f).parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(src / f, dst / f)
        except OSError:
            shutil.copy2(src / f, dst / f)
        taken += (src / f).stat().st_size
        n += 1
    return n, taken


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("src", type=Path)
    ap.add_argument("dst", type=Path)
    ap.add_argument("--share", type=float, default=0.5, help="share of the tree's bytes to take (0-1]")
    a = ap.parse_args()
    if not a.src.is_dir() or not 0 < a.share <= 1:
        raise SystemExit("error: SRC must be a folder and --share in (0, 1]")
    if a.dst.exists() and any(a.dst.iterdir()):
        raise SystemExit(f"error: {a.dst} is not empty")
    n, taken = head(a.src, a.dst, a.share)
    print(f"{n} files, {taken:,} bytes into {a.dst}")


if __name__ == "__main__":
    main()
