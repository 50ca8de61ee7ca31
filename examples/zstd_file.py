"""zstd-compressed file: train on the content of a .zst file (streamed), write generated.zst.

    python examples/zstd_file.py           # ~3 minutes on 2 CPU cores
    python examples/zstd_file.py --steps 20

Data: lambda-phage-zst, the lambda phage FASTA file compressed with zstd -19 (made locally from
the shipped sample). Reader: zstd (decompresses as a stream and models the content: here the FASTA
text itself, header and line breaks included). Output: generated.zst, a valid zstd frame.
The compressed bytes themselves are close to incompressible (see the last line it prints); model
them with --reader zstd:compressed if that is what you want.
"""
from __future__ import annotations

from _common import compressor_bpb, fetch, generate, out_dir, parse_args, report, stream_of, train, write

READER = "zstd"

args = parse_args(__doc__.splitlines()[0], steps=300)
out = out_dir(args, "zstd")
source = fetch("lambda-phage-zst")
result, seconds = train(source, READER, args, out)
data = generate(result, 2000, prompt=b">gi|9626243|ref|NC_001416.1| Enterobacteria phage lambda, complete genome\n")
path = write(data, out / "generated.zst")
report("zstd", "lambda-phage-zst", READER, result, seconds, stream_of(source, READER), path, args)
c = compressor_bpb(stream_of(source, "zstd:compressed"))
print(f"  (the .zst bytes themselves: zstd -19 {c['zstd19']:.3f}, xz -9e {c['xz9']:.3f} bits/byte)")
