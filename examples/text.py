"""Text: train on the Jargon File (public domain, Debian package jargon-text), generate text.

    apt-get install jargon-text            # provides /usr/share/doc/jargon-text/jargon.txt.gz
    python examples/text.py                # a few minutes on 2 CPU cores
    python examples/text.py --steps 20     # smoke test

Reader: text (UTF-8, checked). Output: generated.txt (always valid UTF-8).
"""
from __future__ import annotations

from _common import fetch, generate, out_dir, parse_args, report, stream_of, train, write

READER = "text"

args = parse_args(__doc__.splitlines()[0], steps=300)
out = out_dir(args, "text")
source = fetch("jargon")                  # 1.7 MB of English hacker-lore prose
result, seconds = train(source, READER, args, out)
text = generate(result, 1500, prompt=b":hacker: n. ", temperature=0.8)
print("generated:", text[:300].decode("utf-8", "replace"), "...")
path = write(b":hacker: n. " + text, out / "generated.txt")
report("text", "jargon", READER, result, seconds, stream_of(source, READER), path, args)
