"""DNA: train on the lambda phage genome (shipped with bytemodel), generate a FASTA sequence.

    python examples/dna.py                 # ~3 minutes on 2 CPU cores
    python examples/dna.py --steps 20      # smoke test

Reader: fasta (one document per record, sequence only). Output: generated.fa, 60 columns.
"""
from __future__ import annotations

from _common import fetch, generate, out_dir, parse_args, report, stream_of, train, write

READER = "fasta"

args = parse_args(__doc__.splitlines()[0], steps=300)
out = out_dir(args, "dna")
source = fetch("lambda-phage")            # datasets/lambda_virus.fa, 48,502 bases
result, seconds = train(source, READER, args, out)
seq = generate(result, 3000, stop_at_doc_end=True)
print("generated:", seq[:120].decode("ascii", "replace"), "...")
path = write(seq, out / "generated.fa")
report("dna", "lambda-phage", READER, result, seconds, stream_of(source, READER), path, args)
