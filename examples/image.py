"""Images: train on the Tango icons (public domain) as 16x16 grayscale pixels, generate a PNG.

    apt-get install tango-icon-theme       # 215 icons, 32x32 PNG
    python examples/image.py               # a few minutes on 2 CPU cores
    python examples/image.py --steps 20    # smoke test

Reader: image:size=16x16,gray -> each icon is one document "IMG L 16x16\\n" + 256 pixel bytes, so
a whole image fits in the tiny model's 256-token context. Generation starts from the header and
the writer makes a valid PNG from whatever comes out (generated.png, plus a 4x enlarged copy).
"""
from __future__ import annotations

from _common import fetch, generate, out_dir, parse_args, report, stream_of, train, write

READER = "image:size=16x16,gray"
HEADER = b"IMG L 16x16\n"

args = parse_args(__doc__.splitlines()[0], steps=300)
out = out_dir(args, "image")
source = fetch("tango-icons")
result, seconds = train(source, READER, args, out)
paths = []
for k in range(4):
    pixels = generate(result, 256, prompt=HEADER, seed=k + 1, stop_at_doc_end=True)
    paths.append(write(HEADER + pixels, out / f"generated_{k}.png", READER))
from PIL import Image  # noqa: E402  (a 4x copy, easier to look at)
with Image.open(paths[0]) as im:
    im.resize((64, 64), Image.NEAREST).save(out / "generated_0_x4.png")
report("image", "tango-icons", READER, result, seconds, stream_of(source, READER), paths[0], args)
