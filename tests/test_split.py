"""The readers' exact split (the compressor's view): join(split(x)) == x for every reader that
offers one, on the shipped samples, on hostile files and on arbitrary bytes; the documents are
what `read` gives for well-formed files; and what each layout holds, checked by hand."""
from __future__ import annotations

import gzip
import io
import wave

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from bytemodel.readers import get_reader
from bytemodel.readers.packing import Packer, Unpacker
from bytemodel.resources import datasets_dir

FASTA_SPECS = ["fasta", "fasta:case=upper", "fasta:case=lower", "fasta:n=drop", "fasta:n=split",
               "fasta:case=upper,n=split", "fasta:revcomp"]
HOSTILE = {
    "mixed line lengths": b">a\nACGTACGT\nACG\nACGTACGTAC\nA\n",
    "crlf": b">a b\r\nACGT\r\nAC\r\n>b\r\nGG\r\n",
    "mixed endings": b">a\nACGT\r\nACGT\nAC\r\n",
    "lower case and N runs": b">x\nacgtNNNNnnACGTnNnN\nNNNN\n>y\nnnnn\n",
    "empty records": b">e1\n>e2\n\n>e3\nACGT\n>e4\n",
    "trailing junk": b">a\nACGT\n\x00\x01\xff junk \x7f\n",
    "no final newline": b">a\nACGTAC",
    "before the first header": b"ACGT\n\n>a\nAC\n",
    "spaces and tabs": b">a\nAC GT\n\tACGT\nACGT \n",
    "comments": b";c\n>a\n;in\nACGT\n",
    "only newlines": b"\n\n\n",
    "empty": b"",
    "gt alone": b">",
    "cr alone": b"\r",
}


def _shipped():
    d = datasets_dir()
    return {"lambda": (d / "lambda_virus.fa").read_bytes(),
            "klebsiella (decompressed)": gzip.decompress((d / "klebsiella_hs11286_1m.fa.gz").read_bytes())}


@pytest.mark.parametrize("spec", FASTA_SPECS)
def test_fasta_split_is_exact_on_shipped_and_hostile_files(spec):
    r = get_reader(spec)
    for name, raw in {**_shipped(), **HOSTILE}.items():
        docs, layout = r.split(raw)
        assert r.join(docs, layout) == raw, (spec, name)
        assert r.join(docs, layout, limit=len(raw)) == raw
        if len(raw) > 1000:                    # whole genomes: tiny layouts
            assert len(layout) < 200, (spec, name, len(layout))


@pytest.mark.parametrize("spec", FASTA_SPECS)
def test_fasta_documents_are_what_read_gives(spec, tmp_path):
    r = get_reader(spec)
    for name, raw in {**_shipped(), "crlf": HOSTILE["crlf"], "case": HOSTILE["lower case and N runs"],
                      "empty records": HOSTILE["empty records"], "mixed": HOSTILE["mixed line lengths"]}.items():
        f = tmp_path / "x.fa"
        f.write_bytes(raw)
        assert r.split(raw)[0] == list(r.read(f)), (spec, name)


def test_fasta_layout_by_hand():
    docs, layout = get_reader("fasta:case=upper,n=drop").split(b">a\nacNNgt\nAC\n")
    assert docs == [b"ACGTAC"]
    u = Unpacker(layout)
    assert u.int() == 0 and u.bytes() == b">a"          # the header, verbatim
    assert [u.int() for _ in range(3)] == [1, 6, 1]      # LF: one line of 6 residues
    assert [u.int() for _ in range(3)] == [1, 2, 1]      # LF: one line of 2
    assert [u.int() for _ in range(3)] == [1, 0, 1]      # the empty last line (the file ends in \n)
    assert u.int() == 3                                  # END
    assert [u.int() for _ in range(5)] == [2, 0, 2, 2, 2]   # case runs: 'ac' at 0, 'gt' at 4 (gap 2)
    assert [u.int() for _ in range(4)] == [1, 2, 2, 0]   # one run of N at 2, length 2, upper
    u.end()


def test_fasta_join_refuses_what_does_not_fit():
    r = get_reader("fasta")
    docs, layout = r.split(HOSTILE["mixed line lengths"])
    for bad_docs, bad_layout in [(docs + [b"A"], layout), ([docs[0][:-1]], layout), (docs, layout[:-1]),
                                 (docs, layout + b"\x00"), (docs, b"\x09" + layout)]:
        with pytest.raises(ValueError):
            r.join(bad_docs, bad_layout)
    p = Packer()                                         # a claim of 10^12 lines in a 30-byte layout
    p.int(0), p.bytes(b">a"), p.int(1), p.int(60), p.int(10 ** 12), p.int(3)
    with pytest.raises(ValueError, match="larger"):
        r.join([b"A"], p.done(), limit=1000)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=300), st.sampled_from(FASTA_SPECS))
def test_fasta_split_of_arbitrary_bytes(raw, spec):
    r = get_reader(spec)
    got = r.split(raw)
    if got is None:                                      # only a compressed file has no split
        assert raw[:2] == b"\x1f\x8b" or raw[:3] == b"BZh" or raw[:6] == b"\xfd7zXZ\x00" or raw[:4] == b"\x28\xb5\x2f\xfd"
        return
    assert r.join(*got) == raw


_ALPHABET = st.sampled_from([b"A", b"C", b"g", b"N", b"n", b"\n", b"\r\n", b">h\n", b";c\n", b" ", b"\x00", b"-"])


@settings(max_examples=200, deadline=None)
@given(st.lists(_ALPHABET, max_size=80), st.sampled_from(FASTA_SPECS))
def test_fasta_split_of_fasta_like_bytes(parts, spec):
    raw = b"".join(parts)
    r = get_reader(spec)
    assert r.join(*r.split(raw)) == raw


@settings(max_examples=100, deadline=None)
@given(st.binary(max_size=200), st.sampled_from(["raw", "text", "audio:encoding=pcm16"]))
def test_other_splits_of_arbitrary_bytes(raw, spec):
    r = get_reader(spec)
    got = r.split(raw)
    if got is not None:
        assert r.join(*got) == raw


def test_identity_splits():
    for spec in ("raw", "text"):
        assert get_reader(spec).split(b"abc\xff") == ([b"abc\xff"], b"")
    assert get_reader("text").split(gzip.compress(b"x")) is None    # compressed text: no exact split
    assert get_reader("text:sep=%").split(b"a\n%\nb\n") is None
    with pytest.raises(ValueError):
        get_reader("raw").join([b"a", b"b"], b"")


def _wav(n=801, rate=8000, channels=1, width=2, tail=b""):
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(channels), w.setsampwidth(width), w.setframerate(rate)
        x = (3000 * np.sin(np.arange(n * channels) * 0.07)).astype("<i2")
        w.writeframes(x.tobytes() if width == 2 else (x // 256 + 128).astype(np.uint8).tobytes())
    return buf.getvalue() + tail


@pytest.mark.parametrize("encoding", ["pcm16", "pcm16msb"])
def test_pcm16_wav_and_aiff_split_into_their_samples(tmp_path, encoding):
    sf = pytest.importorskip("soundfile")
    r = get_reader(f"audio:encoding={encoding}")
    x = (3000 * np.sin(np.arange(801) * 0.07)).astype(np.int16)
    sf.write(tmp_path / "a.aiff", x, 8000, format="AIFF", subtype="PCM_16")
    files = {"wav": _wav(), "wav + junk": _wav(tail=b"LIST\x04\x00\x00\x00abcdJUNK"),
             "aiff": (tmp_path / "a.aiff").read_bytes()}
    for name, raw in files.items():
        docs, layout = r.split(raw)
        assert r.join(docs, layout) == raw, name
        f = tmp_path / ("x.aiff" if name == "aiff" else "x.wav")
        f.write_bytes(raw)
        assert docs == list(r.read(f)), name                # the samples, as the reader gives them
        assert len(layout) < 200
    docs, layout = get_reader(f"audio:encoding={encoding},clip=0.05").split(_wav())
    assert [len(d) for d in docs] == [800, 800, 2]           # 801 samples in clips of 400
    for lossy in ("audio", "audio:encoding=pcm16,rate=16000"):
        assert get_reader(lossy).split(_wav()) is None      # mu-law / resampled: no exact split
    assert r.split(_wav(channels=2)) is None and r.split(_wav(width=1)) is None



@pytest.mark.parametrize("exponent", [0x7FFE, 0x7FFF, 0xFFFF])
def test_aiff_rate_out_of_float_range_has_no_split(tmp_path, exponent):
    """A COMM chunk whose 80-bit rate is past a double's range (or infinity, NaN) is no pcm16 AIFF
    to split (the file is coded as it is), never an OverflowError out of the compressor's view."""
    sf = pytest.importorskip("soundfile")
    sf.write(tmp_path / "a.aiff", np.zeros(64, np.int16), 8000, format="AIFF", subtype="PCM_16")
    raw = bytearray((tmp_path / "a.aiff").read_bytes())
    rate = raw.index(b"COMM") + 8 + 8                        # the rate: 10 bytes after ch, frames, bits
    raw[rate:rate + 10] = exponent.to_bytes(2, "big") + b"\xff" * 8
    assert get_reader("audio:encoding=pcm16").split(bytes(raw)) is None

def test_image_has_no_byte_exact_split():
    from PIL import Image
    buf = io.BytesIO()
    Image.new("L", (4, 4)).save(buf, "PNG")
    assert get_reader("image").split(buf.getvalue()) is None


def test_packing_by_hand():
    p = Packer()
    p.int(0), p.int(127), p.int(128), p.int(300), p.bytes(b"ab")
    assert p.done() == b"\x00\x7f\x80\x01\xac\x02\x02ab"
    u = Unpacker(b"\x80")
    with pytest.raises(ValueError):
        u.int()
    with pytest.raises(ValueError):
        Unpacker(b"\x05ab").bytes()
