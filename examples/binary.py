"""Executable: train on the ELF binary /usr/bin/ls as raw bytes, generate bytes after an ELF header.

    python examples/binary.py              # a few minutes on 2 CPU cores
    python examples/binary.py --steps 20   # smoke test

Reader: raw (bytes as they are). Output: generated.bin (a byte file; it is not a runnable program).
"""
from __future__ import annotations

from _common import fetch, generate, out_dir, parse_args, report, stream_of, train, write

READER = "raw"

args = parse_args(__doc__.splitlines()[0], steps=300)
out = out_dir(args, "binary")
source = fetch("elf-ls")                  # this machine's /usr/bin/ls, ~140 kB
result, seconds = train(source, READER, args, out)
prompt = (source / "ls").read_bytes()[:64]  # the ELF header
data = generate(result, 2048, prompt=prompt)
path = write(prompt + data, out / "generated.bin")
report("binary", "elf-ls", READER, result, seconds, stream_of(source, READER), path, args)
