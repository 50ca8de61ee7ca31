"""Hostile .bmz files (issue 23): a header that lies is refused in one line, within the payload's
worth of work; decompress finds its run among ./runs by the weights' hash, never by a path in the
file. Plus a property-based fuzz test of the container reader."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import struct
import zlib

import pytest

pytest.importorskip("constriction")

import bytemodel  # noqa: E402
from bytemodel import compress as bmz  # noqa: E402
from bytemodel.compress import container  # noqa: E402
from conftest import cli as _cli, one_error_line as _one_error_line  # noqa: E402

FAST = dict(preset="tiny", context=32, batch_size=4, eval_every=5, eval_tokens=256, warmup=2, plot=False,
            baseline=False, model={"d_model": 32, "n_layers": 2, "n_heads": 2, "d_ff": 64})


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    """A folder holding runs/toy-1 (a small trained model), as a user's working folder does."""
    d = tmp_path_factory.mktemp("hostile_bmz")
    src = d / "toy.txt"
    src.write_bytes(b"ACGTTGCAACGGTTCA" * 200)
    bytemodel.train(str(src), str(d / "runs" / "toy-1"), steps=10, **FAST)
    return d


@pytest.fixture(scope="module")
def lm(home):
    return bytemodel.load(home / "runs" / "toy-1")


@pytest.fixture(scope="module")
def blob(lm):
    return lm.compress(b"ACGTTGCAACGGTTCA" * 20 + b"ACGA", streams=2)


def _raw_pack(header_bytes: bytes, payload: bytes) -> bytes:
    h = zlib.compress(header_bytes, 9)
    body = bmz.MAGIC + struct.pack("<HI", bmz.VERSION, len(h)) + h + payload
    return body + hashlib.sha256(body).digest()


def _repack(blob: bytes, edit) -> bytes:
    header, payload = bmz.read(blob)
    edit(header)
    return bmz._pack(header, payload)






def test_header_not_an_object_or_too_deep(blob):
    _, payload = bmz.read(blob)
    for text in (b"[1, 2, 3]", b"[" * 100000 + b"]" * 100000, b'"x"', b"null", b'{"format": NaN}'):
        with pytest.raises(bmz.CompressError, match="malformed|not valid JSON"):
            bmz.read(_raw_pack(text, payload))


def test_header_claims_bounded_by_the_payload(lm, blob):
    n = bmz.read(blob)[0]["layout"]["tokens"]
    lies = {
        "streams past the bound": lambda h: h["layout"].update(tokens=10 ** 6, streams=container.MAX_STREAMS + 1),
        "a lane past the bound": lambda h: h["layout"].update(lane=container.MAX_LANE + 1),
        "10^9 streams": lambda h: h["layout"].update(tokens=10 ** 9, streams=10 ** 9),
        "tokens no payload can hold": lambda h: h["layout"].update(tokens=10 ** 12),
        "fewer bytes than tokens": lambda h: h["original"].update(bytes=n - 1),
        "a list as the coder": lambda h: h.update(coder=[1]),
        "an alphabet of 2": lambda h: h["coder"].update(alphabet=2),
    }
    for name, edit in lies.items():
        with pytest.raises(bmz.CompressError, match="malformed"):
            bmz.read(_repack(blob, edit))
    with pytest.raises(bmz.CompressError, match="at most"):
        lm.compress(b"ACGT" * 20000, streams=container.MAX_STREAMS + 1)


def test_a_token_count_the_payload_cannot_hold_stops_early(lm, blob):
    """10^7 tokens claimed (statically possible for a perfectly confident model) in a file of a
    few hundred bytes: decoding stops once the information decoded exceeds the payload's bits,
    long before 10^7 steps (the message names the step; a real stream is ~170 tokens)."""
    def lie(h):
        h["layout"].update(tokens=10 ** 7)
        h["original"].update(bytes=10 ** 7)
    bad = _repack(blob, lie)
    with pytest.raises(bmz.CompressError, match="cannot hold") as e:
        lm.decompress(bad)
    step = int(str(e.value).split("decoding step ")[1].split()[0])
    assert step < 20000, e.value


def test_identity_names_the_run_not_the_file(blob):
    ck = bmz.read(blob)[0]["checkpoint"]
    assert ck["name"] == "toy-1" and ck["file"] == "best.safetensors"


def test_decompress_finds_its_run_by_hash(home, blob, tmp_path):
    packed = home / "x.bmz"
    packed.write_bytes(blob)
    from bytemodel import checkpoint as ck
    ld = ck.load(home / "runs" / "toy-1" / "best.safetensors")     # a newer run with other weights
    ck.save(home / "runs" / "zz-newer" / ck.CKPT_NAME, ld.cfg, ld.tokenizer, ld.params + 0.01, ld.train)
    try:
        code, out = _cli(["decompress", packed, "-o", home / "x.out", "-f"], cwd=home)
        assert code == 0, out
        assert (home / "x.out").read_bytes() == b"ACGTTGCAACGGTTCA" * 20 + b"ACGA"
        # renamed run: the name no longer matches, the hash still does
        os.rename(home / "runs" / "toy-1", home / "runs" / "renamed")
        code, out = _cli(["decompress", packed, "-o", home / "y.out", "-f"], cwd=home)
        assert code == 0, out
    finally:
        shutil.rmtree(home / "runs" / "zz-newer")
        if (home / "runs" / "renamed").exists():
            os.rename(home / "runs" / "renamed", home / "runs" / "toy-1")


def test_decompress_finds_a_run_trained_beside_it(home, blob, tmp_path):
    """`train --out NAME` then `compress -c NAME`: the run is ./NAME, not runs/NAME. decompress in
    that folder finds it by the header's name (still checked by hash); elsewhere it does not."""
    work = tmp_path / "beside"
    shutil.copytree(home / "runs" / "toy-1", work / "toy-1")
    packed = work / "x.bmz"
    packed.write_bytes(blob)
    code, out = _cli(["decompress", packed, "-o", work / "x.out"], cwd=work)
    assert code == 0, out
    assert (work / "x.out").read_bytes() == b"ACGTTGCAACGGTTCA" * 20 + b"ACGA"
    code, out = _cli(["decompress", packed, "-o", tmp_path / "y.out"], cwd=tmp_path)
    assert code != 0 and _one_error_line(out) and "pass --checkpoint" in out, out


def test_a_path_in_the_file_is_never_followed(home, blob, tmp_path):
    """The header names the right run by an absolute path outside ./runs: it must not be loaded."""
    outside = tmp_path / "elsewhere"
    shutil.copytree(home / "runs" / "toy-1", outside)
    evil = _repack(blob, lambda h: h["checkpoint"].update(name=str(outside), file=str(outside / "best.safetensors")))
    (tmp_path / "runs").mkdir()
    packed = tmp_path / "e.bmz"
    packed.write_bytes(evil)
    code, out = _cli(["decompress", packed, "-o", tmp_path / "e.out"], cwd=tmp_path)
    assert code != 0 and _one_error_line(out) and "no run under runs/" in out, out
    assert not (tmp_path / "e.out").exists()


# ------------------------------------------------------------------------ property-based fuzzing

from hypothesis import HealthCheck, given, settings, strategies as st  # noqa: E402

_JSON = st.recursive(st.none() | st.booleans() | st.integers(-2 ** 70, 2 ** 70) | st.floats() | st.text(max_size=8),
                     lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=8), kids, max_size=4),
                     max_leaves=12)


@settings(max_examples=150, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_fuzz_container_reader(blob, data):
    """Random and mutated containers: a (header, payload) or one CompressError, nothing else.
    Memory: the reader holds the file and a header of at most MAX_HEADER (1 MiB) decompressed;
    tracemalloc's peak for one read stays under 8 MiB (files here are under 64 KiB)."""
    import tracemalloc
    header, payload = bmz.read(blob)
    kind = data.draw(st.sampled_from(["bytes", "flip", "field", "json"]))
    if kind == "bytes":
        cand = data.draw(st.binary(max_size=512))
        if data.draw(st.booleans()):
            cand = bmz.MAGIC + cand
    elif kind == "flip":
        raw = bytearray(blob)
        for _ in range(data.draw(st.integers(1, 4))):
            raw[data.draw(st.integers(0, len(raw) - 1))] ^= 1 << data.draw(st.integers(0, 7))
        cand = bytes(raw)
    elif kind == "field":     # a re-signed file with one field replaced by any JSON value
        h = json.loads(json.dumps(header))
        part = data.draw(st.sampled_from(["checkpoint", "original", "layout", "coder", "backend", None]))
        where = h if part is None else h[part]
        key = data.draw(st.sampled_from(sorted(where)))
        where[key] = data.draw(_JSON)
        try:
            cand = bmz._pack(h, payload)
        except (ValueError, TypeError):     # NaN keys or values json.dumps refuses: not a file
            return
    else:
        cand = _raw_pack(json.dumps(data.draw(_JSON)).encode(), payload)
    tracemalloc.start()
    try:
        bmz.read(cand)
    except bmz.CompressError:
        pass
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    assert peak < 8 << 20
