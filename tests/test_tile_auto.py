"""Images in tiles by default when their rows outrun the context (training/autoconf.auto_tile,
training/prepare._tile_images): the rule, and a run that applies it records image:tile=N."""
import numpy as np
import pytest

import bytemodel
from bytemodel import checkpoint as ck
from bytemodel.corpus import open_corpus

pytest.importorskip("PIL")


def _images(folder, width, n=3, mode="RGB", height=40):
    from PIL import Image
    folder.mkdir()
    rng = np.random.default_rng(width)
    shape = (height, width, 3) if mode == "RGB" else (height, width)
    for i in range(n):
        Image.fromarray(rng.integers(0, 255, shape).astype("uint8"), mode).save(folder / f"im{i}.png")
    return folder


def _reader(run) -> str:
    return ck.load(run.run_dir).train["data"]["reader"]


def test_auto_tile_rule():
    from bytemodel.training.autoconf import AUTO_TILE, auto_context, auto_tile
    assert auto_tile(400, 3, 1024) == AUTO_TILE          # 1,200-byte rows past a 1,024-byte context
    assert auto_tile(341, 3, 1024) == 0                  # 1,023 bytes: the row above is in reach
    assert auto_tile(1200, 1, 1024) == AUTO_TILE and auto_tile(1024, 1, 1024) == 0
    assert auto_tile(4000, 3, 128) == 0                  # not even two tile rows fit: tiles cannot help
    assert auto_tile(4000, 3, 192) == AUTO_TILE
    assert auto_context("cuda") == 1024 and auto_context("cpu", 2) == 256 and auto_context("cpu", 8) == 512


def test_wide_images_train_in_tiles(tmp_path, fast_settings):
    """Rows of 1,200 bytes against a 256-byte context: the run reads image:tile=32 (one note line),
    records it (so score and compress read the same view), and trains on the very corpus an
    explicit image:tile=32 gives; tile=0 keeps whole rows; narrow images and a context that holds
    a row are left alone; the reader's other options are kept."""
    s = {**fast_settings, "steps": 1, "context": 256}
    wide = _images(tmp_path / "wide", 400)
    lines = []
    auto = bytemodel.train(wide, tmp_path / "auto", log=lines.append, **s)
    assert sum("images in 32 x 32 tiles (image tile auto" in x for x in lines) == 1
    assert _reader(auto) == "image:tile=32"
    given = bytemodel.train(wide, tmp_path / "given", reader="image:tile=32", **s)
    assert np.array_equal(np.asarray(open_corpus(auto.run_dir).tokens), np.asarray(open_corpus(given.run_dir).tokens))
    rows = bytemodel.train(wide, tmp_path / "rows", reader="image:tile=0", **s)
    assert _reader(rows) == "image:tile=0" and open_corpus(rows.run_dir).n_docs == 3
    assert open_corpus(auto.run_dir).n_docs == 3 * 13 * 2          # 400 / 32 -> 13 tile columns, 40 / 32 -> 2 rows
    assert _reader(bytemodel.train(wide, tmp_path / "long", **{**s, "context": 2048})) == "image"
    narrow = _images(tmp_path / "narrow", 60)
    assert _reader(bytemodel.train(narrow, tmp_path / "narrow_run", **s)) == "image"
    gray = _images(tmp_path / "gray", 400, mode="L")
    assert _reader(bytemodel.train(gray, tmp_path / "gray_run", **s)) == "image:tile=32"
    assert _reader(bytemodel.train(wide, tmp_path / "sized", reader="image:size=64", **s)) == "image:size=64x64"
    assert _reader(bytemodel.train(wide, tmp_path / "gray_given", reader="image:gray", **s)) == \
        "image:grayscale=yes,tile=32"


def test_mixed_folder_keeps_its_readers(tmp_path, fast_settings):
    folder = _images(tmp_path / "mixed", 400, n=1)
    (folder / "notes.txt").write_text("wide images and a note " * 40)
    run = bytemodel.train(folder, tmp_path / "run", **{**fast_settings, "steps": 1, "context": 256})
    assert "tile" not in str(ck.load(run.run_dir).train["data"])
