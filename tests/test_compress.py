"""The model as a compressor: exact round trips, determinism, size against the cross-entropy, bad input.

A small model (context 32) trained for a few steps on synthetic DNA, so its probabilities are far
from uniform and the files below are many contexts long.
"""
from __future__ import annotations

import gzip
import hashlib
import io
import json
import lzma
import os
import struct
import subprocess
import sys
import wave
import zlib
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("constriction")

import bytemodel  # noqa: E402
from bytemodel import compress as bmz  # noqa: E402
from conftest import cli as _cli, one_error_line as _one_error_line  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
FAST = dict(preset="tiny", context=32, batch_size=4, eval_every=40, eval_tokens=256, warmup=2,
            model={"d_model": 32, "n_layers": 2, "n_heads": 2, "d_ff": 64})


def _dna(n, seed=0):
    """Synthetic DNA: the same 8 motifs (learnable), in an order that depends on the seed."""
    m = np.random.default_rng(0)
    motifs = ["".join(m.choice(list("ACGT"), 12)) for _ in range(8)]
    rng = np.random.default_rng(seed)
    return "".join(motifs[i] for i in rng.integers(0, 8, n // 12 + 1))[:n].encode()


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("bmz")
    src = d / "toy.txt"
    src.write_bytes(_dna(6000))
    bytemodel.train(str(src), str(d / "run"), steps=100, lr=3e-3, **FAST)   # ~1.9 bits/byte
    return d / "run"


@pytest.fixture(scope="module")
def lm(run_dir):
    return bytemodel.load(run_dir)


@pytest.fixture(scope="module")
def other_run(tmp_path_factory):
    d = tmp_path_factory.mktemp("bmz_other")
    src = d / "other.txt"
    src.write_bytes(b"hello world, " * 300)
    bytemodel.train(str(src), str(d / "run"), steps=2, **FAST)
    return d / "run"


def samples() -> dict:
    """A small file of every data type, made here (no network, nothing copied in)."""
    rng = np.random.default_rng(1)
    out = {"text": ("The byte model reads raw bytes; a compressor writes what it does not expect. " * 30).encode()}
    from bytemodel.resources import datasets_dir
    fa = (datasets_dir() / "lambda_virus.fa").read_bytes()
    out["fasta"] = fa[:2500]
    from PIL import Image
    img = Image.fromarray((np.add.outer(np.arange(24), np.arange(24)) * 5 % 256).astype(np.uint8), "L")
    buf = io.BytesIO()
    img.save(buf, "PNG")
    out["image"] = buf.getvalue()
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1), w.setsampwidth(2), w.setframerate(8000)
        t = np.arange(800)
        w.writeframes((3000 * np.sin(t * 0.07) + rng.normal(0, 50, 800)).astype("<i2").tobytes())
    out["audio"] = buf.getvalue()
    exe = Path(sys.executable).resolve().read_bytes()
    assert exe[:4] == b"\x7fELF"
    out["elf"] = exe[:2048]
    import zstandard
    out["zstd"] = zstandard.ZstdCompressor(level=3).compress(_dna(4000, seed=3))
    out["random"] = rng.integers(0, 256, 1500).astype(np.uint8).tobytes()
    return out


# ------------------------------------------------------------------------------- parts by hand

def test_quantise_by_hand():
    f = bmz.quantise(np.array([[0.0, 0.0], [1000.0, 0.0]]), 2)
    # even: floor(0.5 * (2^24 - 2)) + 1 = 2^23 each; certain: the other symbol keeps its floor of 1
    assert f.tolist() == [[1 << 23, 1 << 23], [(1 << 24) - 1, 1]]
    rng = np.random.default_rng(0)
    logits = rng.normal(0, 4, (50, 300)).astype(np.float32)
    f = bmz.quantise(logits, 257)                       # the columns past the alphabet are ignored
    assert f.shape == (50, 257) and f.min() >= 1 and (f.sum(axis=1) == 1 << 24).all()
    p = np.exp(logits[:, :257] - logits[:, :257].max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    # floor and +1 change a frequency by at most 257 counts plus the remainder (at most 257) on one
    assert np.abs(f - p * (1 << 24)).max() <= 2 * 257 + 1


def test_split_by_hand():
    assert bmz.split(10, 3).tolist() == [4, 3, 3]
    assert bmz.split(3, 3).tolist() == [1, 1, 1]
    assert bmz.split(0, 0).tolist() == []


# ------------------------------------------------------------------------------- round trips

@pytest.mark.parametrize("kind", list(samples()))
def test_round_trip_every_data_type(lm, kind):
    data = samples()[kind]
    blob = lm.compress(data)
    assert lm.decompress(blob) == data


@pytest.mark.parametrize("data", [b"", b"\x00", b"A", b"\xff"])
def test_round_trip_empty_and_one_byte(lm, data):
    blob = lm.compress(data)
    assert lm.decompress(blob) == data
    assert bmz.read(blob)[0]["original"]["bytes"] == len(data)


@pytest.mark.parametrize("streams,window,lane,coders", [(1, None, None, None), (7, None, 2, 3), (5, 8, 5, 1),
                                                        (40, 32, 16, 6)])
def test_round_trip_longer_than_context(lm, streams, window, lane, coders):
    data = _dna(1200, seed=5)                        # ~40 contexts: the window re-read runs often
    blob = lm.compress(data, streams=streams, window=window, lane=lane, coders=coders)
    header = bmz.read(blob)[0]
    h = header["layout"]
    assert (h["streams"], h["window"]) == (streams, window or 32)
    assert len(header["coder"]["group_words"]) == (coders or 1)
    assert lm.decompress(blob) == data


def test_bpe_tokenizer_round_trip(tmp_path):
    src = tmp_path / "t.txt"
    src.write_bytes(_dna(5000, seed=2))
    bytemodel.train(str(src), str(tmp_path / "run"), steps=3, merges=20, **FAST)
    m = bytemodel.load(tmp_path / "run")
    assert m.tokenizer.n_merges > 0
    data = _dna(2000, seed=9) + b"\x00\x01 tail not in the merges"
    blob = m.compress(data, streams=4)
    assert bmz.read(blob)[0]["layout"]["tokens"] < len(data)  # merges: fewer tokens than bytes
    assert m.decompress(blob) == data


# ------------------------------------------------------------------------------- size

def test_size_within_one_percent_of_cross_entropy(lm):
    """The payload against the model's own float64 cross-entropy on the same file: one stream, the
    same windows as `score` (which re-reads one token more, hence the 1% rather than exact)."""
    data = _dna(1500, seed=7)
    stats: dict = {}
    blob = lm.compress(data, streams=1, stats=stats)
    ce = lm.score(data)["bits"]
    assert ce < 0.3 * 8 * len(data)                   # a model that learned: far from uniform
    assert abs(stats["model_bits"] - ce) <= 0.01 * ce
    header_bytes = len(blob) - stats["payload_bits"] // 8
    assert 8 * len(blob) <= 1.01 * ce + 8 * header_bytes
    # quantisation (>= 1 count in 2^24 per symbol) costs almost nothing; the coder a word or two
    assert stats["quantised_bits"] <= stats["model_bits"] * 1.001
    assert stats["payload_bits"] <= stats["quantised_bits"] + 64
    # many streams: each restarts its context, so the cross-entropy of that layout is the bar
    many: dict = {}
    lm.compress(data, streams=16, stats=many)
    assert many["payload_bits"] <= 1.01 * many["model_bits"] + 64


# ------------------------------------------------------------------------------- determinism

_CHILD = """
import sys, bytemodel
lm = bytemodel.load(sys.argv[1])
mode, src, dst, workers = sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5])
data = open(src, 'rb').read()
out = lm.compress(data, streams=9, lane=2, workers=workers) if mode == 'c' else lm.decompress(data, workers=workers)
open(dst, 'wb').write(out)
"""


def _child(run_dir, mode, src, dst, workers, blas_threads):
    path = os.pathsep.join([str(ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])
    env = dict(os.environ, PYTHONPATH=path, OPENBLAS_NUM_THREADS=str(blas_threads), OMP_NUM_THREADS=str(blas_threads))
    r = subprocess.run([sys.executable, "-c", _CHILD, str(run_dir), mode, str(src), str(dst), str(workers)],
                       env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr


def test_same_bytes_across_processes_and_thread_counts(lm, run_dir, tmp_path):
    data = _dna(2500, seed=11) + bytes(range(256))
    src = tmp_path / "in.bin"
    src.write_bytes(data)
    here = lm.compress(data, streams=9, lane=2, workers=1)          # 5 lanes, one thread
    _child(run_dir, "c", src, tmp_path / "a.bmz", 2, 2)            # another process, 2 threads, 2 BLAS threads
    assert (tmp_path / "a.bmz").read_bytes() == here              # the compressed bytes themselves agree
    _child(run_dir, "d", tmp_path / "a.bmz", tmp_path / "back", 3, 1)
    assert (tmp_path / "back").read_bytes() == data
    assert lm.decompress(here, workers=2) == data
    # the default lanes follow the compressing side's threads (one lane each); the header carries them
    two = lm.compress(data, streams=9, workers=2)
    assert bmz.read(two)[0]["layout"]["lane"] == 5
    assert lm.decompress(two, workers=1) == data


# ------------------------------------------------------------------------------- bad input

def _repack(blob: bytes, edit) -> bytes:
    header, payload = bmz.read(blob)
    edit(header)
    return bmz._pack(header, payload)


def test_bad_files_are_refused(lm, other_run):
    data = _dna(600, seed=4)
    blob = lm.compress(data)
    bad = {
        "truncated": blob[:-5],
        "cut to the magic": blob[:8],
        "bit flip in payload": blob[:-40] + bytes([blob[-40] ^ 1]) + blob[-39:],
        "bit flip in header": blob[:20] + bytes([blob[20] ^ 4]) + blob[21:],
        "foreign": gzip.compress(data),
        "empty": b"",
    }
    for name, b in bad.items():
        with pytest.raises(bmz.CompressError):
            lm.decompress(b)
    with pytest.raises(bmz.CompressError, match="compressed with checkpoint"):
        bytemodel.load(other_run).decompress(blob)


def test_wrong_checksum_or_backend_never_returns_bytes(lm):
    blob = lm.compress(b"ACGTACGTTTGA" * 20)
    lie = _repack(blob, lambda h: h["original"].update(sha256="0" * 64))
    with pytest.raises(bmz.CompressError, match="checksum"):
        lm.decompress(lie)
    gpu = _repack(blob, lambda h: h["backend"].update(device="cuda", precision="fp16"))
    with pytest.raises(bmz.CompressError, match="decompress with a model loaded with device=cuda"):
        lm.decompress(gpu)
    from bytemodel.errors import cli_names
    with cli_names(), pytest.raises(bmz.CompressError, match="decompress with --device cuda$"):
        lm.decompress(gpu)          # the CLI's words (a flag and its value)


# ------------------------------------------------------------------------------- CLI





def test_cli_round_trip_and_refusals(run_dir, other_run, tmp_path):
    f = tmp_path / "sample.fa"
    f.write_bytes(samples()["fasta"])
    code, out = _cli(["compress", f, "-c", run_dir])
    assert code == 0, out
    packed = tmp_path / "sample.fa.bmz"
    assert packed.exists() and "bits/byte" in out
    f.rename(tmp_path / "orig.fa")
    code, out = _cli(["decompress", packed, "-c", run_dir])
    assert code == 0, out
    assert f.read_bytes() == (tmp_path / "orig.fa").read_bytes()
    n = f.stat().st_size                    # a summary on success, as compress prints one
    assert f"-> {n:,} bytes (SHA-256 checked" in out and str(f) in out, out
    # existing output: refused without --force, and left as it was
    code, out = _cli(["decompress", packed, "-c", run_dir])
    assert code != 0 and _one_error_line(out) and "--force" in out
    blob = packed.read_bytes()
    cases = {"truncated": blob[:-7], "flipped": blob[:100] + bytes([blob[100] ^ 16]) + blob[101:],
             "foreign": b"\x89PNG\r\n\x1a\n" + b"\x00" * 64}
    for name, b in cases.items():
        p = tmp_path / f"{name}.bmz"
        p.write_bytes(b)
        code, out = _cli(["decompress", p, "-c", run_dir])
        assert code != 0 and _one_error_line(out), (name, out)
        assert not (tmp_path / name).exists()                     # nothing written
    code, out = _cli(["decompress", packed, "-c", other_run, "-o", tmp_path / "wrong"])
    assert code != 0 and _one_error_line(out) and "compressed with checkpoint" in out
    assert not (tmp_path / "wrong").exists()


def test_eval_runs_the_compressors_while_the_model_scores(lm, tmp_path, monkeypatch):
    """evaluate starts the four compressors on threads before the model scores: a model that waits
    (up to 10 s) for gzip to have started sees it started, and every size is still the size."""
    import threading
    from bytemodel.compress import evaluate as ev
    started, seen = threading.Event(), []
    plain = ev.COMPRESS["gzip -9"]

    def gzip_mark(d):
        started.set()
        return plain(d)

    class Waiting:
        def __getattr__(self, k):
            return getattr(lm, k)

        def score_documents(self, docs):
            seen.append(started.wait(10))
            return lm.score_documents(docs)
    monkeypatch.setitem(ev.COMPRESS, "gzip -9", gzip_mark)
    f = tmp_path / "z.txt"
    f.write_bytes(_dna(900, seed=4))
    res = ev.evaluate(Waiting(), [f], "text")
    assert seen == [True], seen
    row = res["files"][0]
    assert row["compressed_bytes"]["gzip -9"] == len(gzip.compress(f.read_bytes(), 9, mtime=0))
    assert row["compressed_bytes"]["xz -9e"] == len(lzma.compress(f.read_bytes(), preset=9 | lzma.PRESET_EXTREME))


def test_cli_eval_table_and_json(run_dir, lm, tmp_path):
    fa = tmp_path / "x.fa"
    fa.write_bytes(b">seq one\n" + b"\n".join(_dna(1200, seed=8)[i:i + 60] for i in range(0, 1200, 60)) + b"\n")
    txt = tmp_path / "y.txt"
    txt.write_bytes(_dna(700, seed=6))
    code, out = _cli(["eval", fa, txt, "-c", run_dir])
    assert code == 0, out
    for name in ("model", "gzip -9", "bzip2 -9", "xz -9e", "zstd -19", "total"):
        assert name in out
    code, out = _cli(["eval", fa, "-c", run_dir, "--json"])   # the run read its data as text: so is x.fa
    assert code == 0 and [r["view"] for r in json.loads(out)["files"]] == ["as-is"], out
    from bytemodel import checkpoint as ck
    ld = ck.load(run_dir / ck.BEST_NAME)                           # the same weights, a run that read FASTA
    fasta_run = tmp_path / "fasta_run"
    fasta_run.mkdir()
    ck.save(fasta_run / ck.BEST_NAME, ld.cfg, ld.tokenizer, ld.params,
            {**ld.train, "data": {**ld.train["data"], "reader": "fasta"}})
    code, out = _cli(["eval", fa, "-c", fasta_run, "--json"])
    assert code == 0, out
    res = json.loads(out)
    raw = fa.read_bytes()
    row = res["files"][0]
    assert (row["view"], row["bytes"]) == ("as-is", len(raw))
    assert row["bits_per_byte"]["gzip -9"] == pytest.approx(8 * len(gzip.compress(raw, 9, mtime=0)) / len(raw))
    assert row["model_bits"] == pytest.approx(lm.score(raw)["bits"])
    seq = res["files"][1]                                          # the FASTA reader's view: bases only
    assert seq["view"].startswith("fasta") and seq["bytes"] == 1200
    assert seq["model_bits"] == pytest.approx(lm.score(_dna(1200, seed=8))["bits"])
    tot = res["totals"][0]
    assert tot["bytes"] == len(raw)
    code, out = _cli(["eval", fa, txt, "-c", run_dir, "--json"])
    assert code == 0 and json.loads(out)["totals"][0]["bytes"] == len(raw) + 700, out
    code, out = _cli(["eval", tmp_path / "missing.bin", "-c", run_dir])
    assert code != 0 and _one_error_line(out)


# ------------------------------------------------------------------------------- GPU

def _standin_lm(run_dir):
    """The model on a stand-in for a GPU backend: NumPy ops under another name, so compress takes
    the device path (one lane for every stream, several coders on threads, no BLAS limit) in CI."""
    import importlib.util
    spec = importlib.util.find_spec("bytemodel.ops.numpy_ops")
    ops = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ops)
    ops.describe = lambda: {"device": "standin", "precision": "fp32"}
    ops.cpu_threads = False                                  # one "device" runs every lane
    m = bytemodel.load(run_dir)
    m.model.ops = ops
    return m


def test_device_path_through_a_standin_backend(run_dir, lm):
    g = _standin_lm(run_dir)
    data = _dna(1500, seed=13)
    blob = g.compress(data)
    header = bmz.read(blob)[0]
    assert header["backend"] == {"device": "standin", "precision": "fp32"}
    assert header["layout"]["lane"] == header["layout"]["streams"] > 1          # one lane holds them all
    assert (header["layout"]["engine"], header["layout"]["reread"]) == ("lockstep", bmz.LOCKSTEP_REREAD)
    assert len(header["coder"]["group_words"]) == min(bmz.GPU_CODERS, header["layout"]["streams"],
                                                      len(os.sched_getaffinity(0)))
    assert g.decompress(blob) == data
    with pytest.raises(bmz.CompressError, match="device=standin"):
        lm.decompress(blob)                                  # a device file is refused on the CPU
    with pytest.raises(bmz.CompressError, match="device=cpu"):
        g.decompress(lm.compress(data))                      # and a CPU file on the device


def test_default_window_per_device():
    """The CPU codes with the model's whole context; a GPU with at most GPU_WINDOW (speed: the
    cache a step reads grows with the window), never more than the context."""
    assert bmz.default_window(1024, "cpu") == 1024
    assert bmz.default_window(1024, "cuda") == bmz.GPU_WINDOW < 1024
    assert bmz.default_window(64, "cuda") == 64


@pytest.mark.gpu
def test_gpu_round_trip(run_dir):
    from bytemodel.ops import cuda_available
    if not cuda_available():
        pytest.skip("no CUDA GPU")
    g = bytemodel.load(run_dir, device="cuda", precision="fp16")
    data = _dna(3000, seed=12)
    blob = g.compress(data, streams=5)
    assert bmz.read(blob)[0]["backend"]["device"] == "cuda"
    assert g.decompress(blob) == data


# ------------------------------------------------------------------------------- engines (container version 2)

@pytest.mark.parametrize("engine,reread,window", [("cpu", 0, 8), ("cpu", 3, 8), ("cpu", 16, 32), ("lockstep", None, 16),
                                                   ("lockstep", 0, 8), ("lockstep", 4, 8)])
def test_engines_and_reread_policies_round_trip(lm, engine, reread, window):
    data = _dna(900, seed=21)
    blob = lm.compress(data, streams=6, lane=4, window=window, engine=engine, reread=reread)
    lay = bmz.read(blob)[0]["layout"]
    assert (lay["engine"], lay["reread"], lay["window"]) == (engine, window // 2 if reread is None else reread, window)
    assert lm.decompress(blob, workers=2) == data


def test_lockstep_slide_is_what_codes_the_file(lm):
    """reread 0 on the lockstep engine codes with the sliding window (a ring cache), not the
    re-read policy: the two give different probabilities, so different payloads, and each
    decodes back."""
    data = _dna(900, seed=26)                         # streams of ~150 tokens, windows of 8
    slide = lm.compress(data, streams=6, window=8, engine="lockstep", reread=0)
    reread = lm.compress(data, streams=6, window=8, engine="lockstep", reread=4)
    assert bmz.read(slide)[1] != bmz.read(reread)[1]
    assert lm.decompress(slide) == lm.decompress(reread) == data


def test_cpu_engine_default_layout(lm):
    """On the CPU the default is the cpu engine with a sliding window of CPU_WINDOW (or the
    model's context if shorter) and lanes of at most CPU_MAX_LANE streams."""
    data = _dna(3000, seed=22)
    lay = bmz.read(lm.compress(data, workers=2))[0]["layout"]
    assert lay["engine"] == "cpu" and lay["reread"] == 0
    assert lay["window"] == min(bmz.CPU_WINDOW, lm.model.cfg.context)
    assert lay["streams"] == min(bmz.CPU_MAX_STREAMS, 3000 // (bmz.MIN_STREAM * lay["window"]))
    assert lay["lane"] == min(bmz.CPU_MAX_LANE, -(-lay["streams"] // 2))


def _plain_pack(header: dict, payload: bytes, version: int) -> bytes:
    """A container as versions before 4 wrote it (the header deflated without a dictionary),
    claiming `version`."""
    h = zlib.compress(json.dumps(header, sort_keys=True, separators=(",", ":")).encode(), 9)
    body = bmz.MAGIC + struct.pack("<HI", version, len(h)) + h + payload
    return body + hashlib.sha256(body).digest()


def test_the_header_dictionary_is_frozen_and_pays(lm):
    """Version 4 headers are deflated against compress/zdict.HEADER_ZDICT: its bytes may never change
    (every version 4 file needs them), and a header takes well under half what plain zlib leaves
    (about 200 bytes against 700 for a typical one). A version 3 file (no dictionary) still decodes."""
    from bytemodel.compress.zdict import HEADER_ZDICT
    assert hashlib.sha256(HEADER_ZDICT).hexdigest() == "1b5cf9e70b6efd58d999e754769b8be47a56e6b23d5c363c61bbab31482df9fd"
    data = _dna(700, seed=29)
    blob = lm.compress(data, streams=3)
    header, payload = bmz.read(blob)
    assert header["version"] == bmz.VERSION == 5
    hlen = struct.unpack("<I", blob[len(bmz.MAGIC) + 2:len(bmz.MAGIC) + 6])[0]
    v3 = _plain_pack({**header, "version": 3}, payload, 3)
    plain = len(v3) - len(payload) - len(bmz.MAGIC) - 6 - 32       # its header, deflated without the dictionary
    assert hlen < 0.5 * plain, (hlen, plain)
    assert bmz.read(v3)[0]["version"] == 3 and lm.decompress(v3) == data
    with pytest.raises(bmz.CompressError, match="malformed"):       # container 4, header 3: refused
        bmz.read(_plain_pack({**header, "version": 3}, payload, 4))


def _text(n: int) -> bytes:
    src = b"".join(p.read_bytes() for p in sorted((Path(__file__).resolve().parents[1] / "docs").glob("*.md")))
    return src[:n]


def test_a_file_the_model_expands_is_packed_instead(lm, run_dir, tmp_path, monkeypatch):
    """English under a model of four letters: its coding would take more bits than the file has, so
    the .bmz holds the bytes packed by the best of none / zlib / xz (view "packed", no tokens): no
    larger than the file plus the header, decoded exactly, through the API and the CLI. A file the
    model does compress stays the model's; BYTEMODEL_PACK=0 keeps the model's coding."""
    monkeypatch.setenv("BYTEMODEL_PACK", "1")
    data = _text(20_000)
    stats: dict = {}
    blob = lm.compress(data, streams=4, stats=stats)
    header, payload = bmz.read(blob)
    assert stats["model_bits"] > 8 * len(data)                     # the model alone would have expanded it
    assert header["view"]["kind"] == "packed" and header["layout"]["tokens"] == 0
    assert header["view"]["coder"] == "xz" and len(payload) == len(lzma.compress(data, preset=9 | lzma.PRESET_EXTREME))
    assert len(blob) < len(data) and lm.decompress(blob) == data
    dna = _dna(3000, seed=41)
    assert bmz.read(lm.compress(dna, streams=4))[0]["view"]["kind"] == "as-is"
    f = tmp_path / "english.txt"
    f.write_bytes(data)
    code, out = _cli(["compress", f, "-c", run_dir])
    assert code == 0 and "packed by xz, not coded by the model: the model's coding of bytes as they are" in out, out
    code, out = _cli(["decompress", tmp_path / "english.txt.bmz", "-c", run_dir, "-o", tmp_path / "back.txt"])
    assert code == 0 and (tmp_path / "back.txt").read_bytes() == data, out
    # no model coded any of it, so none is needed to undo it: no -c, and no run anywhere near
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    code, out = _cli(["decompress", tmp_path / "english.txt.bmz", "-o", elsewhere / "back.txt"], cwd=elsewhere)
    assert code == 0 and (elsewhere / "back.txt").read_bytes() == data, out
    from bytemodel.compress.driver import decompress as api_decompress
    assert api_decompress(None, blob) == data
    monkeypatch.setenv("BYTEMODEL_PACK", "0")
    assert bmz.read(lm.compress(data, streams=4))[0]["view"]["kind"] == "as-is"


def test_a_packed_view_is_held_to_its_rules(lm, monkeypatch):
    """A packed header that claims tokens, or comes in a version before 5, is refused; a version 4
    file (no packed view) still decodes."""
    monkeypatch.setenv("BYTEMODEL_PACK", "1")
    data = _text(12_000)
    header, payload = bmz.read(lm.compress(data, streams=2))
    assert header["view"]["kind"] == "packed"
    with pytest.raises(bmz.CompressError, match="malformed"):
        bmz.read(bmz._pack({**header, "layout": {**header["layout"], "tokens": 5, "streams": 1}}, payload))
    import zlib as _z
    from bytemodel.compress.zdict import HEADER_ZDICT

    def v4(h, p):
        text = json.dumps({**h, "version": 4}, sort_keys=True, separators=(",", ":")).encode()
        z = _z.compressobj(9, _z.DEFLATED, 15, 9, _z.Z_DEFAULT_STRATEGY, HEADER_ZDICT)
        hz = z.compress(text) + z.flush()
        body = bmz.MAGIC + struct.pack("<HI", 4, len(hz)) + hz + p
        return body + hashlib.sha256(body).digest()
    with pytest.raises(bmz.CompressError, match="unknown view"):
        bmz.read(v4(header, payload))
    # garbage behind a valid checksum: one error, nothing returned; a stream longer than the file: refused
    junk = bytes(range(256)) * 4
    lie = {**header, "payload_bytes": len(junk), "view": {**header["view"], "layout_bytes": len(junk)}}
    with pytest.raises(bmz.CompressError, match="packed data is corrupt"):
        lm.decompress(bmz._pack(lie, junk))
    longer = lzma.compress(data + b"more", preset=9 | lzma.PRESET_EXTREME)
    lie = {**header, "payload_bytes": len(longer), "view": {**header["view"], "layout_bytes": len(longer)}}
    with pytest.raises(bmz.CompressError, match="packed data is corrupt"):
        lm.decompress(bmz._pack(lie, longer))
    other = {"xz": lambda d: lzma.compress(d, preset=9 | lzma.PRESET_EXTREME), "zlib": lambda d: _z.compress(d, 9),
             "none": bytes}[header["view"]["coder"]](data[::-1])     # the right length, other bytes
    lie = {**header, "payload_bytes": len(other), "view": {**header["view"], "layout_bytes": len(other)}}
    with pytest.raises(bmz.CompressError, match="checksum"):
        lm.decompress(bmz._pack(lie, other))
    dna = _dna(900, seed=43)
    h2, p2 = bmz.read(lm.compress(dna, streams=2))
    assert h2["view"]["kind"] == "as-is" and lm.decompress(v4(h2, p2)) == dna


def test_version_1_files_still_decode(lm):
    """A version 1 container (no engine in its layout: the lockstep engine, re-read window/2)."""
    data = _dna(700, seed=23)
    blob = lm.compress(data, streams=3, engine="lockstep", reader="raw")   # version 1 coded the bytes as they are

    def as_v1(h):
        h["version"] = 1
        del h["layout"]["engine"]
    header, payload = bmz.read(blob)
    as_v1(header)
    v1 = _plain_pack(header, payload, 1)
    assert bmz.read(v1)[0]["layout"]["engine"] == "lockstep"
    assert lm.decompress(v1) == data
    with pytest.raises(bmz.CompressError, match="version 9"):
        lm.decompress(_plain_pack(header, payload, 9))


def test_engine_settings_are_validated(lm):
    blob = lm.compress(_dna(500, seed=24), streams=2)
    for edit in (lambda h: h["layout"].update(engine="gpu-magic"),
                 lambda h: h["layout"].update(engine="lockstep", reread=3),     # lockstep re-reads window/2
                 lambda h: h["layout"].update(reread=h["layout"]["window"]),    # must keep fewer than the window
                 lambda h: h["layout"].pop("engine")):
        with pytest.raises(bmz.CompressError, match="malformed"):
            lm.decompress(_repack(blob, edit))
    with pytest.raises(bytemodel.errors.ConfigError):
        lm.compress(b"ACGT" * 50, engine="lockstep", reread=3)
    with pytest.raises(bytemodel.errors.ConfigError):
        lm.compress(b"ACGT" * 50, engine="warp")


def test_cli_window_and_reread(run_dir, tmp_path):
    f = tmp_path / "x.txt"
    f.write_bytes(_dna(800, seed=25))
    code, out = _cli(["compress", f, "-c", run_dir, "--window", 8, "--reread", 4, "-q"])
    assert code == 0, out
    lay = bmz.read((tmp_path / "x.txt.bmz").read_bytes())[0]["layout"]
    assert (lay["window"], lay["reread"], lay["engine"]) == (8, 4, "cpu")
    code, out = _cli(["decompress", tmp_path / "x.txt.bmz", "-c", run_dir, "-o", tmp_path / "back"])
    assert code == 0 and (tmp_path / "back").read_bytes() == f.read_bytes()
    code, out = _cli(["compress", f, "-c", run_dir, "--window", 8, "--reread", 8, "-o", tmp_path / "bad.bmz"])
    assert code != 0 and _one_error_line(out) and not (tmp_path / "bad.bmz").exists()


# ------------------------------------------------------------------------------- the reader's view

def _fasta_file(n=3000, seed=30, width=60):
    seq = _dna(n, seed=seed)
    return b">toy record\n" + b"\n".join(seq[i:i + width] for i in range(0, n, width)) + b"\n"


def test_fasta_view_codes_the_bases_and_rebuilds_the_file(lm):
    raw = _fasta_file()
    st_split, st_raw = {}, {}
    split = lm.compress(raw, reader="fasta", stats=st_split)
    as_is = lm.compress(raw, stats=st_raw)
    h = bmz.read(split)[0]
    assert h["view"]["kind"] == "split" and h["reader"] == "fasta" and h["view"]["layout_bytes"] > 0
    assert h["view"]["coded"]["bytes"] == 3000 and h["original"]["bytes"] == len(raw)
    assert bmz.read(as_is)[0]["view"]["kind"] == "as-is"
    assert lm.decompress(split) == raw and lm.decompress(as_is) == raw
    # the model was trained on bases without line breaks: coding the bases is cheaper than the bytes
    assert len(split) < len(as_is)
    # the payload is the model's bits on the bases plus the layout (the test above: within 1%)
    assert st_split["payload_bits"] <= 1.01 * st_split["model_bits"] + 64
    for hostile in (b">a\r\nACGTAC\r\nAC\r\n>b\n\nacgtNNNN\n\x00junk", b">only a header\n", b""):
        assert lm.decompress(lm.compress(hostile, reader="fasta:case=upper,n=split")) == hostile


def test_a_layout_that_does_not_rebuild_is_refused(lm):
    raw = _fasta_file(600, seed=31)
    blob = lm.compress(raw, reader="fasta")
    header, payload = bmz.read(blob)
    nw = 4 * sum(header["coder"]["group_words"])
    layout = payload[nw:]
    assert header["view"]["coder"] == "none"             # small: packing it would not pay
    lie = bytearray(layout)
    lie[-3] ^= 1                                         # one case/line-length byte of the layout
    with pytest.raises(bmz.CompressError, match="layout|checksum"):
        lm.decompress(bmz._pack(header, payload[:nw] + bytes(lie)))
    header["view"]["coder"] = "xz"                       # a layout that is not what its coder says
    with pytest.raises(bmz.CompressError, match="layout"):
        lm.decompress(bmz._pack(header, payload))


def test_no_exact_split_codes_the_bytes_and_says_why(lm):
    wav = samples()["audio"]
    st = {}
    blob = lm.compress(wav, reader="audio", stats=st)    # mu-law: the reader's view is lossy
    v = bmz.read(blob)[0]["view"]
    assert v["kind"] == "as-is" and "no exact split" in v["why"] and "as they are" in st["view"].describe()
    assert lm.decompress(blob) == wav
    pcm = lm.compress(wav, reader="audio:encoding=pcm16")
    assert bmz.read(pcm)[0]["view"]["kind"] == "split" and lm.decompress(pcm) == wav
    elf = samples()["elf"]                               # a DNA reader on an ELF: too little of it is sequence
    v = bmz.read(lm.compress(elf, reader="fasta"))[0]["view"]
    assert v["kind"] == "as-is" and "hold only" in v["why"]


def test_image_content_is_pixel_exact(lm, tmp_path):
    from PIL import Image
    png = samples()["image"]
    with pytest.raises(bmz.CompressError, match="content"):
        lm.compress(png, reader="fasta", content=True)
    blob = lm.compress(png, reader="image", content=True)
    h = bmz.read(blob)[0]
    assert h["view"]["kind"] == "content" and h["view"]["format"] == "PNG"
    back = lm.decompress(blob)
    assert Image.open(io.BytesIO(back)).tobytes() == Image.open(io.BytesIO(png)).tobytes()
    assert bmz.read(lm.compress(png, reader="image"))[0]["view"]["kind"] == "as-is"
    buf = io.BytesIO()
    Image.open(io.BytesIO(png)).convert("RGB").save(buf, "JPEG")
    with pytest.raises(bmz.CompressError, match="lossless"):
        lm.compress(buf.getvalue(), reader="image", content=True)


def _recorded_as(run_dir, where, reader):
    """The run's best weights as a run that recorded `reader` (None: not known, so each file is
    read by the reader detection picks for it)."""
    from bytemodel import checkpoint as ck
    ld = ck.load(run_dir / ck.BEST_NAME)
    where.mkdir()
    ck.save(where / ck.BEST_NAME, ld.cfg, ld.tokenizer, ld.params,
            {**ld.train, "data": {**ld.train["data"], "reader": reader}})
    return where


def test_cli_summary_of_an_empty_file(run_dir, tmp_path):
    """An empty file compresses to its header and checksum, says so (no rate per byte of nothing),
    and decompresses to nothing."""
    f = tmp_path / "empty.bin"
    f.write_bytes(b"")
    code, out = _cli(["compress", f, "-c", run_dir])
    assert code == 0 and "an empty file" in out and "bits/byte" not in out, out
    code, out = _cli(["decompress", tmp_path / "empty.bin.bmz", "-c", run_dir, "-o", tmp_path / "back"])
    assert code == 0 and (tmp_path / "back").read_bytes() == b"", out


def test_cli_summary_names_the_view(run_dir, tmp_path):
    f = tmp_path / "s.fa"
    f.write_bytes(_fasta_file(900, seed=32))
    code, out = _cli(["compress", f, "-c", run_dir, "-o", tmp_path / "as_text.bmz"])
    assert code == 0 and "the text reader's document is the file" in out, out   # the run read text
    fasta_run = _recorded_as(run_dir, tmp_path / "fasta_run", "fasta")
    code, out = _cli(["compress", f, "-c", fasta_run])
    assert code == 0 and "fasta split" in out, out
    run_dir = _recorded_as(run_dir, tmp_path / "detecting_run", None)   # each file by its detected reader
    w = tmp_path / "s.wav"
    w.write_bytes(samples()["audio"])
    code, out = _cli(["compress", w, "-c", run_dir])
    assert code == 0 and "bytes as they are" in out and "no exact split" in out, out
    p = tmp_path / "s.png"
    p.write_bytes(samples()["image"])
    code, out = _cli(["compress", p, "-c", run_dir, "--content"])
    assert code == 0 and "pixel content (PNG" in out, out
    code, out = _cli(["decompress", tmp_path / "s.png.bmz", "-c", run_dir, "-o", tmp_path / "back.png"])
    assert code == 0, out
    from PIL import Image
    assert Image.open(tmp_path / "back.png").tobytes() == Image.open(p).tobytes()
    # a layout that does not rebuild: one error line, nothing written
    blob = (tmp_path / "s.fa.bmz").read_bytes()
    header, payload = bmz.read(blob)
    header["original"]["sha256"] = "0" * 64
    (tmp_path / "lie.bmz").write_bytes(bmz._pack(header, payload))
    code, out = _cli(["decompress", tmp_path / "lie.bmz", "-c", fasta_run])
    assert code != 0 and _one_error_line(out) and not (tmp_path / "lie").exists(), out


def test_cli_eval_takes_a_directory(run_dir, tmp_path):
    """`eval DIR` measures every non-hidden file under it, a row each in name order (as `score DIR`
    reads a directory; before: "not a regular file"); an empty directory is one error line."""
    d = tmp_path / "held"
    (d / "sub").mkdir(parents=True)
    (d / "b.txt").write_bytes(_dna(500, seed=1))
    (d / "sub" / "a.txt").write_bytes(_dna(300, seed=2))
    (d / ".hidden").write_bytes(b"x" * 50)
    one = tmp_path / "c.txt"
    one.write_bytes(_dna(200, seed=3))
    code, out = _cli(["eval", d, one, "-c", run_dir, "--json"])
    assert code == 0, out
    res = json.loads(out)
    assert [(Path(r["file"]).relative_to(tmp_path).as_posix(), r["bytes"]) for r in res["files"]] == \
        [("held/b.txt", 500), ("held/sub/a.txt", 300), ("c.txt", 200)]
    assert res["totals"][0]["bytes"] == 1000
    (tmp_path / "empty").mkdir()
    code, out = _cli(["eval", tmp_path / "empty", "-c", run_dir])
    assert code == 2 and out.startswith("error: ") and "no files" in out, out


def test_the_api_takes_str_as_utf8_and_refuses_other_types(lm):
    """score, score_documents and compress take a str as its UTF-8 bytes (as generate takes a
    prompt); other types, and a str given to decompress, are one ConfigError naming what to give
    (before: TypeError "string argument without an encoding")."""
    text = "naïve café, ACGT"
    assert lm.score(text)["bits"] == pytest.approx(lm.score(text.encode())["bits"], rel=1e-12)
    assert lm.score_documents([text, b"ACGT"])["documents"] == 2
    assert lm.decompress(lm.compress(text, streams=2)) == text.encode()
    assert lm.decompress(bytearray(lm.compress(b"ACGTACGT", streams=2))) == b"ACGTACGT"
    for call, words in ((lambda: lm.score(123), "score takes bytes"), (lambda: lm.compress(None), "compress takes bytes"),
                        (lambda: lm.decompress("x.bmz"), "the .bmz file's bytes")):
        with pytest.raises(bytemodel.ConfigError, match=words):
            call()
