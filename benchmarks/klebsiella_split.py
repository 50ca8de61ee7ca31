"""Split the catalogue's four Klebsiella genomes (`bytemodel data get klebsiella`) into a training
directory and a held-out file that no run sees, drawn like the run's own validation tail.

    python benchmarks/klebsiella_split.py DATA_DIR OUT_DIR [--block 2048] [--val-fraction 0.1]

A run validates on the last 10% of its token stream. To make a held-out file that measures the
same thing, the end of the NTUH-K2044 chromosome is cut into blocks of --block bases, taken in
turn: the even blocks, joined, become the last training file (so they are exactly the run's
validation tail: the region's length is solved for that), the odd blocks, joined the same way,
become OUT_DIR/heldout.fa. Validation and held-out are then interleaved stretches of one region,
equally far from (and equally shared with) the training data, and a model's best validation and
its held-out score estimate the same quantity.

OUT_DIR/train/ gets the three other genomes whole (HS11286, Kp1084, MGH 78578, as shipped:
.fna.xz), NTUH-K2044_head.fa (the chromosome before the region) and NTUH-K2044_val.fa (the even
blocks); the chromosome's plasmid is left out. The token counts follow the run's corpus rule
(bytemodel/corpus.py: one token per base, one separator per record; the last
int(n * val_fraction) tokens validate) for the byte tokenizer.
"""
import argparse
import lzma
import shutil
from pathlib import Path

WHOLE = ["Klebs_HS11286.fna.xz", "Klebs_Kp1084.fna.xz", "MGH78578.fna.xz"]
SPLIT = "NTUH-K2044.fna.xz"


def records(path: Path):
    """(header, sequence) of every record of a (xz-compressed) FASTA file."""
    header, seq = None, []
    with lzma.open(path, "rb") as f:
        for line in f:
            line = line.strip()
            if line.startswith(b">"):
                if header is not None:
                    yield header, b"".join(seq)
                header, seq = line[1:].decode(), []
            elif line:
                seq.append(line)
    if header is not None:
        yield header, b"".join(seq)


def fasta(header: str, seq: bytes) -> bytes:
    return (f">{header}\n".encode() + b"\n".join(seq[i:i + 60] for i in range(0, len(seq), 60)) + b"\n")


def interleave(region: bytes, block: int) -> tuple[bytes, bytes]:
    """(even blocks joined, odd blocks joined)."""
    blocks = [region[i:i + block] for i in range(0, len(region), block)]
    return b"".join(blocks[0::2]), b"".join(blocks[1::2])


def solve(L: int, others: int, block: int, frac: float) -> int:
    """The region length r whose even blocks are exactly the validation tail.

    Tokens: others + (L - r + 1) head + (E + 1) validation record, E = len(even blocks of r).
    f(r) = int(frac * n) - (E + 1) never increases with r and steps by 0 or 1, so it takes the
    value 0; binary search for it."""
    def f(r):
        E = _evens(r, block)
        n = others + (L - r + 1) + (E + 1)
        return int(n * frac) - (E + 1)
    lo, hi = 1, L - 1
    if f(lo) < 0 or f(hi) > 0:
        raise SystemExit("cannot place the validation tail inside the chromosome")
    while lo < hi:
        mid = (lo + hi) // 2
        if f(mid) > 0:
            lo = mid + 1
        else:
            hi = mid
    if f(lo) != 0:
        raise SystemExit("no region length gives an exact validation tail")
    return lo


def _evens(r: int, block: int) -> int:
    full, rest = divmod(r, block)
    return (full + 1) // 2 * block + (rest if full % 2 == 0 else 0)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("data", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--block", type=int, default=2048, help="bases per interleaved block")
    ap.add_argument("--val-fraction", type=float, default=0.1, help="the run's validation fraction")
    a = ap.parse_args()
    train = a.out / "train"
    train.mkdir(parents=True, exist_ok=True)
    others = 0
    for name in WHOLE:
        shutil.copyfile(a.data / name, train / name)
        others += sum(len(s) + 1 for _, s in records(a.data / name) if s)
    header, seq = next(records(a.data / SPLIT))
    L = len(seq)
    r = solve(L, others, a.block, a.val_fraction)
    cut = L - r
    val, held = interleave(seq[cut:], a.block)
    (train / "NTUH-K2044_head.fa").write_bytes(fasta(header + f" bases 1-{cut}", seq[:cut]))
    note = f" bases {cut + 1}-{L} in blocks of {a.block}"
    (train / "NTUH-K2044_val.fa").write_bytes(fasta(header + note + ", even blocks (validation)", val))
    (a.out / "heldout.fa").write_bytes(fasta(header + note + ", odd blocks (held out)", held))
    n = others + cut + 1 + len(val) + 1
    print(f"{train}: 3 genomes + {cut:,} bases of NTUH-K2044 + {len(val):,} bases of even blocks "
          f"(the validation tail: {int(n * a.val_fraction):,} of {n:,} tokens); "
          f"{a.out / 'heldout.fa'}: {len(held):,} bases of odd blocks")


if __name__ == "__main__":
    main()
