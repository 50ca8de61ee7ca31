"""Split the catalogue's four Klebsiella genomes (`bytemodel data get klebsiella`) into a training
directory and a held-out file that no run sees.

    python benchmarks/klebsiella_split.py DATA_DIR OUT_DIR [--heldout 0.2]

OUT_DIR/train/ gets three genomes whole (HS11286, Kp1084, MGH 78578, as shipped: .fna.xz) and the
first (1 - heldout) of the NTUH-K2044 chromosome; OUT_DIR/heldout.fa gets the rest of that
chromosome (its plasmid is left out). The training files sort with NTUH-K2044 last, so a run's
validation tail (its last 10%) is the stretch of the same chromosome just before the held-out part:
the held-out score and the best validation then measure the same kind of sequence.
"""
import argparse
import lzma
import shutil
from pathlib import Path

WHOLE = ["Klebs_HS11286.fna.xz", "Klebs_Kp1084.fna.xz", "MGH78578.fna.xz"]
SPLIT = "NTUH-K2044.fna.xz"


def first_record(path: Path) -> tuple[str, bytes]:
    header, seq = None, []
    with lzma.open(path, "rb") as f:
        for line in f:
            line = line.strip()
            if line.startswith(b">"):
                if header is not None:
                    break
                header = line[1:].decode()
            elif line:
                seq.append(line)
    return header, b"".join(seq)


def fasta(header: str, seq: bytes) -> bytes:
    return (f">{header}\n".encode() + b"\n".join(seq[i:i + 60] for i in range(0, len(seq), 60)) + b"\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("data", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--heldout", type=float, default=0.2)
    a = ap.parse_args()
    train = a.out / "train"
    train.mkdir(parents=True, exist_ok=True)
    for name in WHOLE:
        shutil.copyfile(a.data / name, train / name)
    header, seq = first_record(a.data / SPLIT)
    cut = int(len(seq) * (1 - a.heldout))
    (train / "NTUH-K2044_head.fa").write_bytes(fasta(header + f" bases 1-{cut}", seq[:cut]))
    (a.out / "heldout.fa").write_bytes(fasta(header + f" bases {cut + 1}-{len(seq)}", seq[cut:]))
    print(f"{train}: 3 genomes + {cut:,} bases of NTUH-K2044; {a.out / 'heldout.fa'}: {len(seq) - cut:,} bases")


if __name__ == "__main__":
    main()
