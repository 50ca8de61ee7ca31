"""Readers: registry, detection, and each reader's round trip on real data and its bad-input errors.

Real data comes from the shipped lambda phage genome, from files that exist on any machine (this
repository's sources, the Python interpreter's ELF binary), or from the Debian packages named in
.ci/apt-packages.txt; a test whose package is missing skips with the package's name.
"""
from __future__ import annotations

import gzip
import os
import subprocess
import sys
import textwrap
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

from bytemodel.errors import BytemodelError, ConfigError, SourceError
from bytemodel.readers import (Reader, detect, get_reader, list_readers, read_documents, register,
                               stream_documents, write_output)
from bytemodel.readers import registry
from conftest import PEAK_KB

ROOT = Path(__file__).resolve().parents[1]
LAMBDA = ROOT / "datasets" / "lambda_virus.fa"
LAMBDA_LEN = 48502  # Enterobacteria phage lambda, NC_001416.1, complete genome

DEBIAN = {
    "lambda_gz": ("bowtie2-examples", "/usr/share/doc/bowtie2/examples/reference/lambda_virus.fa.gz"),
    "klebsiella": ("kleborate-examples", "/usr/share/doc/kleborate/examples/data/Klebs_HS11286.fna.xz"),
    "wav": ("alsa-utils", "/usr/share/sounds/alsa/Front_Center.wav"),
    "ogg": ("sound-theme-freedesktop", "/usr/share/sounds/freedesktop/stereo/bell.oga"),
    "png": ("tango-icon-theme", "/usr/share/icons/Tango/32x32/apps/accessories-calculator.png"),
    "fortunes": ("fortunes-min", "/usr/share/games/fortunes/fortunes"),
}


def debian_file(key: str) -> Path:
    """The path of a file from a Debian package, or skip naming the package to install."""
    package, path = DEBIAN[key]
    p = Path(path)
    if not p.is_file():
        pytest.skip(f"needs Debian package {package} ({path}); see .ci/apt-packages.txt")
    return p


def one(path, reader=None) -> bytes:
    docs = list(read_documents(path, reader))
    assert len(docs) == 1, f"expected one document, got {len(docs)}"
    return docs[0]


# ---- registry and detection ----------------------------------------------------------------------
def test_builtin_readers_are_listed_with_descriptions():
    names = [c.name for c in list_readers()]
    for n in ("raw", "text", "fasta", "zstd", "image", "audio"):
        assert n in names
    for c in list_readers():
        assert c.description and "\n" not in c.description


def test_spec_strings_parse_and_round_trip():
    r = get_reader("image:size=64x48,gray")
    assert r.options == {"size": (64, 48), "grayscale": True}
    assert get_reader(r.spec).options == r.options
    assert get_reader("audio", rate=16000).options == {"rate": 16000}
    assert get_reader("text:sep=%").options == {"sep": "%"}
    inst = get_reader("zstd")
    assert get_reader(inst) is inst


@pytest.mark.parametrize("spec, error, words", [
    ("nosuch", SourceError, "unknown reader 'nosuch'"),
    ("image:colour=red", ConfigError, "no option 'colour'"),
    ("image:size=0x5", ConfigError, "size"),
    ("audio:encoding=mp3", ConfigError, "mulaw, pcm16, pcm16msb"),
    ("zstd:level=99", ConfigError, "1..22"),
])
def test_bad_specs_are_one_line_errors(spec, error, words):
    with pytest.raises(error) as e:
        get_reader(spec)
    assert words in str(e.value) and "\n" not in str(e.value)


def test_detect_by_extension_then_magic(tmp_path):
    cases = {"a.fa.gz": "fasta", "a.FASTA": "fasta", "b.png": "image", "c.zst": "zstd", "d.txt": "text",
             "e.wav": "audio", "f.bin": "raw", "g.txt.gz": "text"}
    for name, want in cases.items():
        (tmp_path / name).write_bytes(b"x")
        assert detect(tmp_path / name).name == want, name
    magic = {"m1": b"\x89PNG\r\n\x1a\n" + bytes(8), "m2": b"RIFF\x00\x00\x00\x00WAVEfmt ",
             "m3": b"\x28\xb5\x2f\xfd" + bytes(8), "m4": b">seq1\nACGTNACGT\n", "m5": b"\x7fELF\x02\x01",
             "m6": b">not fasta\nhello, world\n"}
    want = {"m1": "image", "m2": "audio", "m3": "zstd", "m4": "fasta", "m5": "raw", "m6": "raw"}
    for name, head in magic.items():
        (tmp_path / name).write_bytes(head)
        assert detect(tmp_path / name).name == want[name], name


class Rec(Reader):
    """Test reader: records of a uint16 little-endian length then that many bytes."""
    name = "testrec"
    extensions = (".rec",)
    magic = (b"REC1",)
    description = "length-prefixed test records"

    def read(self, path):
        data = Path(path).read_bytes()[4:]
        i = 0
        while i < len(data):
            n = int.from_bytes(data[i:i + 2], "little")
            if i + 2 + n > len(data):
                raise SourceError(f"{path}: record at offset {i + 4} is truncated")
            yield data[i + 2:i + 2 + n]
            i += 2 + n

    def write(self, data, path):
        Path(path).write_bytes(b"REC1" + len(data).to_bytes(2, "little") + data)
        return Path(path)


def test_register_custom_reader(tmp_path):
    register(Rec)
    try:
        f = tmp_path / "x.rec"
        f.write_bytes(b"REC1" + b"\x03\x00abc" + b"\x02\x00de")
        assert list(read_documents(f)) == [b"abc", b"de"]
        assert list(read_documents(f, "testrec")) == [b"abc", b"de"]
        g = tmp_path / "noext"
        g.write_bytes(f.read_bytes())
        assert detect(g).name == "testrec"
        write_output(b"hello", tmp_path / "out.rec")
        assert list(read_documents(tmp_path / "out.rec")) == [b"hello"]
        with pytest.raises(ValueError, match="already registered"):
            register(type("Other", (Rec,), {}), name="testrec")
    finally:
        registry._READERS.pop("testrec", None)


def test_entry_point_plugin_is_loaded(tmp_path, monkeypatch):
    site = tmp_path / "site"
    (site / "bmplug-0.1.dist-info").mkdir(parents=True)
    (site / "bmplug.py").write_text(textwrap.dedent("""
        from bytemodel.readers import Reader
        class Upper(Reader):
            name = "upper"
            extensions = (".upper",)
            description = "upper-cased text (plugin)"
            def read(self, path):
                yield open(path, "rb").read().upper()
    """))
    (site / "bmplug-0.1.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: bmplug\nVersion: 0.1\n")
    (site / "bmplug-0.1.dist-info" / "entry_points.txt").write_text("[bytemodel.readers]\nupper = bmplug:Upper\n"
                                                                   "broken = bmplug:Missing\n")
    monkeypatch.syspath_prepend(str(site))
    try:
        with pytest.warns(UserWarning, match="broken"):
            registry.load_plugins(force=True)
        f = tmp_path / "a.upper"
        f.write_bytes(b"abc")
        assert one(f) == b"ABC"
        assert "upper" in [c.name for c in list_readers()]
    finally:
        registry._READERS.pop("upper", None)


# ---- sources: files, directories, errors ----------------------------------------------------------
def test_directory_is_walked_sorted_and_hidden_entries_skipped(tmp_path):
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "2.bin").write_bytes(b"two")
    (tmp_path / "1.bin").write_bytes(b"one")
    (tmp_path / ".git").mkdir()
    (tmp_path / ".git" / "HEAD").write_bytes(b"hidden")
    (tmp_path / ".swp").write_bytes(b"hidden")
    assert list(read_documents(tmp_path)) == [b"one", b"two"]


def test_missing_path_and_empty_directory(tmp_path):
    with pytest.raises(SourceError, match="source not found"):
        list(read_documents(tmp_path / "nope"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(SourceError, match="directory has no files"):
        list(read_documents(tmp_path / "empty"))


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root reads any file")
def test_unreadable_file(tmp_path):
    f = tmp_path / "secret.bin"
    f.write_bytes(b"x")
    f.chmod(0)
    with pytest.raises(SourceError, match="cannot read"):
        list(read_documents(f))


# ---- raw -------------------------------------------------------------------------------------------
def test_raw_round_trip_on_an_executable(tmp_path):
    elf = Path(os.path.realpath(sys.executable))
    data = one(elf, "raw")
    assert data == elf.read_bytes()
    if sys.platform.startswith("linux"):
        assert data[:4] == b"\x7fELF"
    out = write_output(data, tmp_path / "copy.bin")
    assert one(out) == data
    pieces = list(stream_documents(elf, "raw", chunk_size=1 << 16))
    assert b"".join(p for p, _ in pieces) == data
    assert [last for _, last in pieces].count(True) == 1 and pieces[-1][1]


def test_raw_empty_file_is_one_empty_document(tmp_path):
    (tmp_path / "e.bin").write_bytes(b"")
    assert list(read_documents(tmp_path / "e.bin")) == [b""]
    assert list(stream_documents(tmp_path / "e.bin")) == [(b"", True)]


# ---- text ------------------------------------------------------------------------------------------
def test_text_round_trip_on_real_text(tmp_path):
    src = ROOT / "bytemodel" / "readers" / "text.py"  # real UTF-8 text that always exists
    data = one(src, "text")
    assert data == src.read_bytes()
    out = write_output(data, tmp_path / "t.txt.gz")
    assert gzip.decompress(out.read_bytes()) == data
    assert one(out) == data


def test_text_fortunes_split_on_separator(tmp_path):
    f = debian_file("fortunes")
    docs = list(read_documents(f, "text:sep=%"))
    raw = f.read_bytes()
    assert len(docs) == raw.count(b"\n%\n") + 1 - raw.endswith(b"\n%\n")
    assert all(b"\n%\n" not in d and d.endswith(b"\n") for d in docs)
    assert b"".join(docs) == raw.replace(b"%\n", b"")


def test_text_invalid_utf8_names_the_offset(tmp_path):
    f = tmp_path / "bad.txt"
    f.write_bytes("héllo\nwörld\n".encode() + b"ab\xffcd")
    with pytest.raises(SourceError) as e:
        list(read_documents(f))
    msg = str(e.value)
    assert "invalid UTF-8 at byte offset 16 (line 3, byte 0xff)" in msg and 'reader="raw"' in msg
    assert one(f, "raw") == f.read_bytes()  # raw takes the same bytes as they are


def test_text_stream_splits_characters_across_pieces(tmp_path):
    data = ("α→🙂 " * 1000).encode()
    f = tmp_path / "u.txt"
    f.write_bytes(data)
    for size in (1, 2, 3, 5, 7, 4096):
        got = [p for p, _ in stream_documents(f, "text", chunk_size=size)]
        assert b"".join(got) == data
        for p in got:
            p.decode("utf-8")  # every piece is whole characters
    f.write_bytes("a🙂".encode()[:-1])  # the file ends inside the emoji's 4 bytes
    with pytest.raises(SourceError, match="ends inside a character"):
        list(read_documents(f))


def test_text_encoding_option_and_writer_repair(tmp_path):
    f = tmp_path / "w.txt"
    f.write_bytes(b"caf\xe9 \x92quoted\x92\n")
    assert one(f, "text:encoding=cp1252") == "café ’quoted’\n".encode()
    out = write_output(b"ok \xff\xfe bad", tmp_path / "o.txt")
    assert out.read_bytes().decode("utf-8") == "ok \ufffd\ufffd bad"


# ---- fasta -----------------------------------------------------------------------------------------
def test_fasta_shipped_lambda_genome(tmp_path):
    seq = one(LAMBDA)
    assert len(seq) == LAMBDA_LEN and set(seq) <= set(b"ACGT")
    out = write_output(seq, tmp_path / "lambda.fa")
    lines = out.read_bytes().split(b"\n")
    assert lines[0] == b">generated by bytemodel" and lines[-1] == b""
    assert all(len(line) == 60 for line in lines[1:-2]) and 0 < len(lines[-2]) <= 60
    assert one(out) == seq
    gz = write_output(seq, tmp_path / "lambda.fa.gz")
    assert gz.read_bytes()[:2] == b"\x1f\x8b" and one(gz) == seq
    for ext, magic in ((".xz", b"\xfd7zXZ"), (".bz2", b"BZh")):
        out = write_output(seq[:5000], tmp_path / ("short.fa" + ext))
        assert out.read_bytes().startswith(magic) and one(out) == seq[:5000]


def test_fasta_debian_gz_matches_shipped_sample():
    assert one(debian_file("lambda_gz")) == one(LAMBDA)


def test_fasta_multi_record_xz_round_trip(tmp_path):
    f = debian_file("klebsiella")
    docs = list(read_documents(f))
    assert len(docs) == 7 and len(docs[0]) > 5_000_000  # chromosome + 6 plasmids
    reader = get_reader("fasta")
    out = reader.write_records(docs, tmp_path / "k.fa.gz")
    assert list(read_documents(out)) == docs


def test_fasta_case_and_n_options(tmp_path):
    f = tmp_path / "m.fa"
    f.write_bytes(b";old comment\n>r1 desc\nACgt NN\nnnAC\n\n>empty\n>r3\r\nTTTT\r\n")
    assert list(read_documents(f)) == [b"ACgtNNnnAC", b"TTTT"]
    assert list(read_documents(f, "fasta:case=upper")) == [b"ACGTNNNNAC", b"TTTT"]
    assert list(read_documents(f, "fasta:case=lower")) == [b"acgtnnnnac", b"tttt"]
    assert list(read_documents(f, "fasta:n=drop")) == [b"ACgtAC", b"TTTT"]
    assert list(read_documents(f, "fasta:n=split")) == [b"ACgt", b"AC", b"TTTT"]


@pytest.mark.parametrize("content, words", [
    (b">only a header\n>and another\n", "FASTA has no sequence (2 header line(s)"),
    (b"", "no FASTA records"),
    (b"ACGT\n>h\nACGT\n", "line 1: sequence before the first '>' header"),
    (b">h\nACGT\nAC1T\n", "line 3: '1' is not a sequence character"),
    (b">h\nAC\x00T\n", "line 2: byte 0x00 is not a sequence character"),
])
def test_fasta_bad_input(tmp_path, content, words):
    f = tmp_path / "bad.fa"
    f.write_bytes(content)
    with pytest.raises(SourceError) as e:
        list(read_documents(f))
    assert words in str(e.value) and "\n" not in str(e.value)


def test_fasta_truncated_gzip_is_an_error(tmp_path):
    blob = gzip.compress(LAMBDA.read_bytes())
    f = tmp_path / "cut.fa.gz"
    f.write_bytes(blob[: len(blob) // 2])
    with pytest.raises(SourceError, match="truncated"):
        list(read_documents(f))


def test_fasta_writer_makes_any_bytes_valid(tmp_path):
    out = write_output(b"AC GT\n\x00\xff>x*-", tmp_path / "g.fa")
    assert out.read_bytes() == b">generated by bytemodel\nACGTNNNx*-\n"
    assert one(out) == b"ACGTNNNx*-"


def test_fasta_writer_keeps_a_header_the_data_begins_with(tmp_path):
    """A record given whole (">name\\nbases"): its header line is the file's, not bases turned to N;
    the reader's header option still wins; a header alone gives an empty record."""
    out = write_output(b">chr1 my sample\nACGT\nacgt", tmp_path / "h.fa")
    assert out.read_bytes() == b">chr1 my sample\nACGTacgt\n"
    out = write_output(b">chr1\nACGT", tmp_path / "o.fa", fmt="fasta:header=mine")
    assert out.read_bytes() == b">mine\nACGT\n"
    assert write_output(b">only", tmp_path / "e.fa").read_bytes() == b">only\n"


# ---- zstd ------------------------------------------------------------------------------------------
def _zst(data: bytes, **kw) -> bytes:
    import zstandard
    return zstandard.ZstdCompressor(**kw).compress(data)


def test_zstd_round_trip_and_compressed_option(tmp_path):
    pytest.importorskip("zstandard")
    seq = LAMBDA.read_bytes()
    f = tmp_path / "lambda.fa.zst"
    out = write_output(seq, f, fmt="zst")
    assert one(out, "zstd") == seq
    assert one(out) == one(LAMBDA)  # .fa.zst: fasta reader, decompressed by magic
    again = write_output(one(out, "zstd"), tmp_path / "again.zst")
    assert one(again) == seq
    assert one(out, "zstd:compressed") == out.read_bytes()
    raw = write_output(out.read_bytes(), tmp_path / "c.zst", fmt="zstd:compressed")
    assert raw.read_bytes() == out.read_bytes()


def test_zstd_several_frames_and_skippable_frames(tmp_path):
    pytest.importorskip("zstandard")
    skippable = b"\x50\x2a\x4d\x18" + (3).to_bytes(4, "little") + b"abc"
    f = tmp_path / "multi.zst"
    f.write_bytes(_zst(b"hello ") + skippable + _zst(b"world", write_checksum=True))
    assert one(f) == b"hello world"
    assert b"".join(p for p, _ in stream_documents(f, chunk_size=3)) == b"hello world"


@pytest.mark.parametrize("damage, words", [
    (lambda c: c[: len(c) // 2], "truncated zstd stream"),
    (lambda c: c[:-2], "inside the content checksum"),
    (lambda c: c + b"junk!", "unexpected bytes at offset"),
    (lambda c: b"", "is empty"),
    (lambda c: b"not zstd at all", "does not start with a zstd frame"),
    (lambda c: c[:4] + bytes([c[4] | 0x08]) + c[5:], "reserved bit"),
    (lambda c: c[:-40] + bytes([c[-40] ^ 0x55]) + c[-39:], "zstd decompress error"),
], ids=["truncated", "cut-checksum", "trailing", "empty", "not-zstd", "reserved-bit", "flipped-byte"])
def test_zstd_corrupt_input(tmp_path, damage, words):
    pytest.importorskip("zstandard")
    blob = _zst(LAMBDA.read_bytes(), level=3, write_checksum=True)
    f = tmp_path / "bad.zst"
    f.write_bytes(damage(blob))
    with pytest.raises(SourceError) as e:
        list(read_documents(f))
    assert words in str(e.value) and "\n" not in str(e.value)


def _big_zst(path: Path, mib: int) -> int:
    """Write a zstd stream of ``mib`` MiB of varied content (random + zero runs); returns its size."""
    import zstandard
    rng = np.random.default_rng(0)
    block = rng.integers(0, 256, 1 << 16, dtype=np.uint8).tobytes()
    with open(path, "wb") as f, zstandard.ZstdCompressor(level=1).stream_writer(f) as w:
        for i in range(mib * 16):
            k = (i * 7919) % 65536
            w.write(block[:k] + bytes(65536 - k))
    return mib << 20


def test_zstd_large_stream_has_bounded_memory(tmp_path):
    """200 MiB of content streams with < 8 MiB of Python heap (tracemalloc) and the process's peak
    resident memory grows < 64 MiB (measured in a fresh interpreter)."""
    pytest.importorskip("zstandard")
    f = tmp_path / "big.zst"
    size = _big_zst(f, 200)
    assert f.stat().st_size < size // 4
    tracemalloc.start()
    try:
        n = ends = 0
        for piece, last in stream_documents(f):
            n += len(piece)
            ends += last
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert n == size and ends == 1
    assert peak < 8 << 20, f"Python heap peak {peak / 2**20:.1f} MiB"
    code = PEAK_KB + textwrap.dedent("""
        import sys
        from bytemodel.readers import stream_documents, get_reader
        get_reader("zstd")
        before = peak_kb()
        n = sum(len(p) for p, _ in stream_documents(sys.argv[1]))
        after = peak_kb()
        print(n, (after - before) // 1024)
    """)
    r = subprocess.run([sys.executable, "-c", code, str(f)], capture_output=True, text=True, cwd=ROOT,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    n, grew_mib = map(int, r.stdout.split())
    assert n == size and grew_mib < 64, f"resident memory grew {grew_mib} MiB"


def test_raw_read_does_not_duplicate_a_large_file(tmp_path):
    f = tmp_path / "big.bin"
    size = 64 << 20
    with open(f, "wb") as w:
        w.truncate(size)
    tracemalloc.start()
    try:
        data = one(f, "raw")
        _, peak = tracemalloc.get_traced_memory()
        del data
        tracemalloc.reset_peak()
        n = sum(len(p) for p, _ in stream_documents(f, "raw"))
        _, stream_peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < size + (1 << 20), f"read peak {peak / 2**20:.1f} MiB for a 64 MiB file"
    assert n == size and stream_peak < 4 << 20


# ---- image -----------------------------------------------------------------------------------------
def test_image_round_trip_on_a_real_png(tmp_path):
    Image = pytest.importorskip("PIL.Image")
    png = debian_file("png")
    doc = one(png)
    with Image.open(png) as im:
        w, h = im.size
        expect = im.convert("RGBA").tobytes()
    assert doc.startswith(b"IMG RGBA %dx%d\n" % (w, h)) and doc.endswith(expect)
    out = write_output(doc, tmp_path / "gen.png")
    with Image.open(out) as im:
        assert im.format == "PNG" and im.size == (w, h) and im.tobytes() == expect
    assert one(out) == doc


def test_image_jpeg_size_and_gray_options(tmp_path):
    Image = pytest.importorskip("PIL.Image")
    src = Image.open(debian_file("png")).convert("RGB").resize((48, 32))
    jpg = tmp_path / "x.jpg"
    src.save(jpg, quality=90)
    doc = one(jpg, "image:size=16x16,gray")
    assert doc.startswith(b"IMG L 16x16\n") and len(doc) == len(b"IMG L 16x16\n") + 256
    out = write_output(doc, tmp_path / "g.png", fmt="image:gray")
    assert one(out) == doc
    rgb = one(jpg)
    assert rgb.startswith(b"IMG RGB 48x32\n") and len(rgb) == 14 + 48 * 32 * 3


def test_image_16bit_gray_is_scaled(tmp_path):
    Image = pytest.importorskip("PIL.Image")
    a = (np.arange(64, dtype=np.uint16).reshape(8, 8) * 1024)
    f = tmp_path / "g16.png"
    Image.fromarray(a).save(f)
    doc = one(f)
    assert doc.startswith(b"IMG L 8x8\n")
    assert np.frombuffer(doc[10:], np.uint8).tolist() == (a // 256).ravel().tolist()


@pytest.mark.parametrize("data, size, mode", [
    (b"IMG L 3x2\n" + bytes(range(6)), (3, 2), "L"),
    (b"IMG RGB 4x4\n" + b"\xff" * 5, (4, 4), "RGB"),          # short: padded with zeros
    (b"IMG RGBA 2x1\n" + b"\x01" * 100, (2, 1), "RGBA"),      # long: cut
    (b"IMG RGB 99999x2\n" + b"\x07" * 10, (64, 64), "RGB"),   # side too large: default
    (b"IMG XYZ 4x4\n\x01\x02", (64, 64), "RGB"),              # unknown mode: default
    (b"", (64, 64), "RGB"),
    (bytes(range(256)) * 3, (64, 64), "RGB"),
])
def test_image_writer_turns_any_bytes_into_a_png(tmp_path, data, size, mode):
    Image = pytest.importorskip("PIL.Image")
    out = write_output(data, tmp_path / "o.png")
    with Image.open(out) as im:
        im.load()
        assert (im.format, im.size, im.mode) == ("PNG", size, mode)


def test_image_writer_fallback_follows_reader_options(tmp_path):
    Image = pytest.importorskip("PIL.Image")
    out = write_output(b"garbage", tmp_path / "o.png", fmt="image:size=8x4,gray")
    with Image.open(out) as im:
        assert (im.size, im.mode) == ((8, 4), "L")
        assert im.tobytes()[:7] == b"garbage"


def test_image_writer_property_random_bytes(tmp_path):
    Image = pytest.importorskip("PIL.Image")
    pytest.importorskip("hypothesis")
    from hypothesis import given, settings, strategies as st

    @settings(max_examples=40, deadline=None)
    @given(st.binary(max_size=300), st.sampled_from([b"", b"IMG L 5x3\n", b"IMG RGB 2x9\n", b"IMG RGBA 1x1\n"]))
    def check(body, head):
        out = write_output(head + body, tmp_path / "p.png")
        with Image.open(out) as im:
            im.load()
        assert one(out).startswith(b"IMG ")
    check()


@pytest.mark.parametrize("make, words", [
    (lambda png: png[: len(png) // 2], "cannot decode image"),
    (lambda png: b"this is not an image", "cannot identify image file"),
    (lambda png: png[:8], "cannot decode image"),
], ids=["truncated", "not-an-image", "signature-only"])
def test_image_bad_input(tmp_path, make, words):
    pytest.importorskip("PIL.Image")
    png = debian_file("png").read_bytes()
    f = tmp_path / "bad.png"
    f.write_bytes(make(png))
    with pytest.raises(SourceError) as e:
        list(read_documents(f))
    assert words in str(e.value) and "\n" not in str(e.value)


# ---- audio -----------------------------------------------------------------------------------------
def test_mulaw_codec():
    from bytemodel.readers.audio import mulaw_decode, mulaw_encode
    codes = np.arange(256, dtype=np.uint8)
    assert (mulaw_encode(mulaw_decode(codes)) == codes).all()  # decode->encode is the identity
    x = np.arange(-32768, 32768, dtype=np.int64)
    err = np.abs(mulaw_decode(mulaw_encode(x.astype(np.int16))).astype(np.int64) - x)
    assert (err <= np.maximum(4, np.abs(x) // 16 + 8)).all()  # ~4 mantissa bits: relative error < 1/16


@pytest.mark.parametrize("spec", ["audio", "audio:encoding=pcm16", "audio:encoding=pcm16msb", "audio:rate=16000"])
def test_audio_round_trip_on_real_wav(tmp_path, spec):
    sf = pytest.importorskip("soundfile")
    wav = debian_file("wav")
    info = sf.info(str(wav))
    doc = one(wav, spec)
    r = get_reader(spec)
    per_sample = 2 if r.encoding.startswith("pcm16") else 1
    assert abs(len(doc) / per_sample - info.frames * r.rate / info.samplerate) <= 1
    out = write_output(doc, tmp_path / "g.wav", fmt=spec)
    back = sf.info(str(out))
    assert (back.format, back.subtype, back.channels, back.samplerate) == ("WAV", "PCM_16", 1, r.rate)
    assert one(out, spec) == doc


def test_pcm16msb_is_the_high_byte_first_in_offset_binary(tmp_path):
    """pcm16msb: sample + 32768 as big-endian bytes (so a byte's order is its amplitude's), the same
    samples as pcm16 for every int16 value; a real file reads to the same samples either way."""
    sf = pytest.importorskip("soundfile")
    r, le = get_reader("audio:encoding=pcm16msb"), get_reader("audio:encoding=pcm16")
    x = np.array([-32768, -257, -256, -1, 0, 1, 255, 256, 32767], np.int16)
    assert r.encode(x) == bytes([0x00, 0x00, 0x7E, 0xFF, 0x7F, 0x00, 0x7F, 0xFF, 0x80, 0x00,
                                 0x80, 0x01, 0x80, 0xFF, 0x81, 0x00, 0xFF, 0xFF])
    every = np.arange(-32768, 32768).astype(np.int16)
    assert np.array_equal(r.decode(r.encode(every)), every)
    hi = np.frombuffer(r.encode(every), np.uint8)[0::2]
    assert (np.diff(hi.astype(int)) >= 0).all()              # the high byte rises with the sample
    wav = debian_file("wav")
    assert np.array_equal(r.decode(one(wav, r)), le.decode(one(wav, le)))
    out = write_output(one(wav, r), tmp_path / "m.wav", fmt="audio:encoding=pcm16msb")
    assert one(out, le) == one(wav, le)                      # written back as the same samples


def test_audio_ogg_is_decoded():
    pytest.importorskip("soundfile")
    doc = one(debian_file("ogg"))
    assert len(doc) > 500 and len(set(doc)) > 20  # a real sound, not silence


def test_audio_resample_keeps_the_pitch(tmp_path):
    sf = pytest.importorskip("soundfile")
    t = np.arange(48000) / 48000
    stereo = np.stack([np.sin(2 * np.pi * 440 * t), 0.5 * np.sin(2 * np.pi * 440 * t)], axis=1) * 0.5
    f = tmp_path / "a440.flac"
    sf.write(str(f), stereo, 48000, subtype="PCM_16")
    r = get_reader("audio:encoding=pcm16")
    x = r.decode(one(f, r)).astype(np.float64)
    assert len(x) == 8000
    peak_hz = np.argmax(np.abs(np.fft.rfft(x))) * 8000 / len(x)
    assert abs(peak_hz - 440) <= 1
    assert abs(np.abs(x).max() - 0.75 * 0.5 * 32767) < 500  # channels averaged


def test_audio_clip_option_splits_documents(tmp_path):
    sf = pytest.importorskip("soundfile")
    f = tmp_path / "s.wav"
    sf.write(str(f), np.zeros(8000 * 5 // 2, np.int16), 8000)
    docs = list(read_documents(f, "audio:clip=1"))
    assert [len(d) for d in docs] == [8000, 8000, 4000]


def test_audio_writer_any_bytes_is_playable(tmp_path):
    sf = pytest.importorskip("soundfile")
    out = write_output(os.urandom(1001), tmp_path / "n.wav", fmt="audio:encoding=pcm16")
    data, rate = sf.read(str(out), dtype="int16")
    assert rate == 8000 and data.shape == (500,)
    out = write_output(b"", tmp_path / "e.wav")
    assert sf.info(str(out)).frames == 0


@pytest.mark.parametrize("content, words", [
    (b"RIFF\x24\x00\x00\x00WAVEfmt garbage garbage garbage", "cannot decode audio"),
    (b"just some text, not audio", "cannot decode audio"),
])
def test_audio_bad_input(tmp_path, content, words):
    pytest.importorskip("soundfile")
    f = tmp_path / "bad.wav"
    f.write_bytes(content)
    with pytest.raises(SourceError) as e:
        list(read_documents(f))
    assert words in str(e.value) and "\n" not in str(e.value)


def test_audio_without_samples_is_an_error(tmp_path):
    sf = pytest.importorskip("soundfile")
    f = tmp_path / "silent.wav"
    sf.write(str(f), np.zeros(0, np.int16), 8000)
    with pytest.raises(SourceError, match="no samples"):
        list(read_documents(f))


# ---- write_output ----------------------------------------------------------------------------------
def test_write_output_picks_the_format(tmp_path):
    assert write_output(b"abc", tmp_path / "x.raw").read_bytes() == b"abc"
    assert write_output(b"abc", tmp_path / "noext").read_bytes() == b"abc"
    assert write_output(b"ACGT", tmp_path / "y", fmt="fa").read_bytes().startswith(b">")
    assert write_output(b"IMG L 1x1\n\x00", tmp_path / "z", fmt="png").read_bytes()[:4] == b"\x89PNG"
    assert write_output(b"\x00\x01", tmp_path / "w", fmt="wav").read_bytes()[:4] == b"RIFF"
    assert write_output(b"hi", tmp_path / "v", fmt="txt").read_bytes() == b"hi"
    with pytest.raises(ConfigError, match="unknown output format 'docx'"):
        write_output(b"x", tmp_path / "u", fmt="docx")
    assert not list(tmp_path.glob(".*.tmp*"))  # no temp files left behind


def test_errors_are_bytemodel_errors():
    assert issubclass(SourceError, BytemodelError) and issubclass(ConfigError, BytemodelError)


def test_optional_libraries_are_imported_lazily():
    """`import bytemodel.readers` works on machines without soundfile, Pillow or zstandard."""
    code = ("import sys, bytemodel, bytemodel.readers, bytemodel.catalogue; "
            "print(sorted(m for m in ('soundfile', 'PIL', 'zstandard') if m in sys.modules))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"


def test_missing_optional_library_is_a_one_line_error(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "soundfile", None)  # import soundfile -> ImportError
    f = tmp_path / "a.wav"
    f.write_bytes(b"RIFF")
    with pytest.raises(SourceError, match="the audio reader needs the Python package 'soundfile'"):
        list(read_documents(f))


@pytest.mark.parametrize("w,h,mode,n", [(37, 23, "RGB", 8), (5, 9, "L", 4), (16, 16, "RGBA", 16), (7, 3, "RGB", 10)])
def test_image_tiles_round_trip_pixel_exact(tmp_path, w, h, mode, n):
    """tile=N: odd sides (edge tiles narrower/shorter), every mode; the writer rebuilds the image."""
    Image = pytest.importorskip("PIL.Image")
    import numpy as np
    a = np.random.default_rng(w * h).integers(0, 256, size=(h, w, len(mode)), dtype=np.uint8)
    src = tmp_path / "src.png"
    Image.fromarray(a[..., 0] if mode == "L" else a, mode).save(src)
    docs = list(get_reader(f"image:tile={n}").read(src))
    assert len(docs) == -(-w // n) * -(-h // n)
    assert docs[0].startswith(b"IMG %s %dx%d tile %d at 0,0\n" % (mode.encode(), w, h, n))
    tw, th = min(n, w), min(n, h)   # the first tile's rows, in the tile
    body = docs[0][docs[0].index(b"\n") + 1:]
    assert body == a[:th, :tw].tobytes()
    out = write_output(b"".join(docs), tmp_path / "back.png", fmt=f"image:tile={n}")
    with Image.open(out) as im:
        assert im.size == (w, h) and im.mode == mode and im.tobytes() == a.tobytes()
    if len(docs) > 1:   # a tile missing (as a model might leave out): black there, the rest in place
        out = write_output(b"".join(docs[1:]), tmp_path / "part.png")
        with Image.open(out) as im:
            b = np.asarray(im).reshape(h, w, len(mode))
        assert (b[:th, :tw] == 0).all() and (b[:th, tw:] == a[:th, tw:]).all() and (b[th:] == a[th:]).all()


def test_a_compressed_file_no_name_claims_is_read_by_its_content(tmp_path):
    # gcide.dict.dz (dictzip) was modelled as its compressed bytes (8 bits/byte, nothing to learn):
    # the content's reader is picked from its decompressed head; binary content stays raw
    import gzip
    import lzma
    from bytemodel.readers import detect
    (tmp_path / "words.dict.dz").write_bytes(gzip.compress(b"apple\n  a fruit\n" * 50))
    (tmp_path / "seq.dat.xz").write_bytes(lzma.compress(b">chr1 test\nACGTACGTAC\nGGTT\n" * 20))
    (tmp_path / "blob.bin.gz").write_bytes(gzip.compress(bytes(range(256)) * 8))
    (tmp_path / "broken.dat.gz").write_bytes(gzip.compress(b"text " * 100)[:30])
    assert detect(tmp_path / "words.dict.dz").name == "text"
    assert detect(tmp_path / "seq.dat.xz").name == "fasta"
    assert detect(tmp_path / "blob.bin.gz").name == "raw"
    assert detect(tmp_path / "broken.dat.gz").name in ("raw", "text")   # never an exception
    docs = list(detect(tmp_path / "words.dict.dz").read(tmp_path / "words.dict.dz"))
    assert b"".join(docs) == b"apple\n  a fruit\n" * 50


def test_invalid_utf8_names_the_encoding_option(tmp_path):
    from bytemodel.errors import SourceError
    from bytemodel.readers import get_reader
    f = tmp_path / "old.txt"
    f.write_bytes(b"caf\xe9 au lait\n")
    with pytest.raises(SourceError, match="text:encoding=cp1252"):
        list(get_reader("text").read(f))
    assert list(get_reader("text:encoding=cp1252").read(f)) == ["café au lait\n".encode()]


def test_a_reader_option_that_is_not_a_number_is_worded_for_the_user():
    """A number option given something else says what it wants (before: Python's own "invalid
    literal for int() with base 10"); an option's own range check keeps its words."""
    for spec, words in (("image:tile=abc", "option tile: must be a whole number, got 'abc'"),
                        ("audio:clip=x", "option clip: must be a number, got 'x'"),
                        ("zstd:level=99", "zstd level must be 1..22")):
        with pytest.raises(ConfigError) as e:
            get_reader(spec)
        assert words in str(e.value) and "literal" not in str(e.value), str(e.value)
