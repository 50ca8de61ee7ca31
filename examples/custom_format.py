"""A custom binary format through the Python API: a reader for 2-bit packed DNA records.

    python examples/custom_format.py          # ~3 minutes on 2 CPU cores
    python examples/custom_format.py --steps 20

The format (.dna2), made up for this example:

    b"DNA2" | record* ;  record = uint32 LE n_bases | ceil(n_bases / 4) bytes,
    four bases per byte, first base in the high bits, A=0 C=1 G=2 T=3

It is real binary data: nothing in it is text, and a model trained on the packed bytes would have to
learn the packing. The reader below unpacks each record into one ACGT document instead; its writer
packs generated bases back into a valid .dna2 file. The data is the shipped lambda phage genome,
written as 1,000-base records.
"""
from __future__ import annotations

import struct
from pathlib import Path

import numpy as np

from _common import generate, out_dir, parse_args, report, stream_of, train, write
from bytemodel.errors import SourceError
from bytemodel.readers import Reader, read_documents, register

BASES = b"ACGT"
CODE = np.full(256, 255, np.uint8)
CODE[list(BASES)] = np.arange(4)


@register
class PackedDNA(Reader):
    """.dna2 files: 2-bit packed DNA records -> one ACGT document per record."""
    name = "dna2"
    extensions = (".dna2",)
    magic = (b"DNA2",)
    description = "2-bit packed DNA records (example custom format)"

    def read(self, path):
        data = Path(path).read_bytes()
        if not data.startswith(b"DNA2"):
            raise SourceError(f"{path}: not a .dna2 file (no DNA2 magic)")
        i = 4
        while i < len(data):
            if i + 4 > len(data):
                raise SourceError(f"{path}: truncated record header at byte {i}")
            (n,) = struct.unpack_from("<I", data, i)
            nbytes = (n + 3) // 4
            if i + 4 + nbytes > len(data):
                raise SourceError(f"{path}: record at byte {i} needs {nbytes} bytes, file ends first")
            packed = np.frombuffer(data, np.uint8, nbytes, i + 4)
            codes = np.stack([(packed >> s) & 3 for s in (6, 4, 2, 0)], axis=1).ravel()[:n]
            yield np.frombuffer(BASES, np.uint8)[codes].tobytes()
            i += 4 + nbytes

    def write(self, data, path):
        """Any bytes -> one valid record: bytes other than A/C/G/T are dropped."""
        codes = CODE[np.frombuffer(bytes(data), np.uint8)]
        codes = codes[codes != 255]
        n = len(codes)
        padded = np.concatenate([codes, np.zeros(-n % 4, np.uint8)]).reshape(-1, 4)
        packed = (padded[:, 0] << 6 | padded[:, 1] << 4 | padded[:, 2] << 2 | padded[:, 3]).astype(np.uint8)
        Path(path).write_bytes(b"DNA2" + struct.pack("<I", n) + packed.tobytes())
        return Path(path)


def pack_file(seq: bytes, path: Path, record: int = 1000) -> None:
    """Write a genome as .dna2 records of `record` bases (through the reader's own writer)."""
    parts = [b"DNA2"]
    for k in range(0, len(seq), record):
        tmp = path.with_suffix(".part")
        PackedDNA().write(seq[k:k + record], tmp)
        parts.append(tmp.read_bytes()[4:])
        tmp.unlink()
    path.write_bytes(b"".join(parts))


args = parse_args(__doc__.splitlines()[0], steps=300)
out = out_dir(args, "custom_format")
genome = b"".join(read_documents(Path(__file__).resolve().parents[1] / "datasets" / "lambda_virus.fa"))
source = out / "data" / "lambda.dna2"
source.parent.mkdir(exist_ok=True)
pack_file(genome, source)
assert b"".join(read_documents(source)) == genome  # the reader inverts the packing exactly
print(f"{source}: {source.stat().st_size:,} bytes for {len(genome):,} bases "
      f"in {len(list(read_documents(source)))} records")

result, seconds = train(source, "dna2", args, out)   # detection by extension would pick dna2 too
bases = generate(result, 1000, stop_at_doc_end=True)
path = write(bases, out / "generated.dna2")
print("generated record:", b"".join(read_documents(path))[:100].decode(), "...")
report("custom_format", "lambda-phage as .dna2", "dna2", result, seconds, stream_of(source, "dna2"), path, args)
