"""Adapting while coding (compress --adapt): exact round trips, the same bytes across thread
counts and processes, what adaptation gains, and the refusals (other backend, checkpoint, start,
settings). A fresh tiny model (no training) and a two-layer run trained for a few steps."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("constriction")

import bytemodel  # noqa: E402
from bytemodel import compress as bmz  # noqa: E402
from bytemodel.compress.adapt import Adapt, Fresh, settings  # noqa: E402
from bytemodel.errors import CompressError, ConfigError  # noqa: E402
from conftest import cli as _cli, one_error_line as _one_error_line  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
FAST = dict(preset="tiny", context=32, batch_size=4, eval_every=40, eval_tokens=256, warmup=2,
            model={"d_model": 32, "n_layers": 2, "n_heads": 2, "d_ff": 64})
TEXT = (b"To adapt is to learn the file while coding it; the decoder repeats every step. " * 12)[:900]
SMALL = dict(d_model=32, n_layers=2, n_heads=2, d_ff=64)    # a fresh model small enough for CI


@pytest.fixture(scope="module")
def fresh():
    return Fresh("tiny", **SMALL)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("adapt")
    src = d / "toy.txt"
    src.write_bytes(b"ACGTTGCAAGGT" * 400)
    bytemodel.train(str(src), str(d / "run"), steps=20, lr=3e-3, **FAST)
    return d / "run"


def test_fresh_round_trip_and_what_adapting_gains(fresh):
    before = fresh.model.params.copy()
    st_a, st_s = {}, {}
    a = settings(fresh, segment=8, lr=1e-2)
    assert a.start == "preset:tiny"
    blob = bmz.compress(fresh, TEXT, adapt=a, streams=2, stats=st_a)
    static = bmz.compress(fresh, TEXT, streams=2, stats=st_s)
    assert np.array_equal(fresh.model.params, before)          # coding leaves the model as it found it
    assert bmz.decompress(Fresh("tiny", **SMALL), blob) == TEXT  # a second fresh model: the same start
    h = bmz.read(blob)[0]
    assert h["adapt"] == a.header() and bmz.read(static)[0]["adapt"] is None
    # a fresh model codes near 8 bits/byte; learning this repetitive text as it goes must do far better
    assert st_s["model_bits"] > 7.5 * len(TEXT)
    assert st_a["model_bits"] < 0.6 * st_s["model_bits"], (st_a["model_bits"], st_s["model_bits"])
    assert st_a["payload_bits"] <= 1.01 * st_a["model_bits"] + 64      # the coder still codes the model's bits


def test_sgd_and_uneven_streams_round_trip(fresh):
    a = settings(fresh, segment=5, optimizer="sgd", lr=0.05)
    data = TEXT[:401]                                           # 3 streams of 134, 134, 133: the last step is partial
    blob = bmz.compress(fresh, data, adapt=a, streams=3, lane=2)
    assert bmz.decompress(fresh, blob) == data
    assert bmz.decompress(fresh, bmz.compress(fresh, b"x", adapt=a)) == b"x"
    assert bmz.decompress(fresh, bmz.compress(fresh, b"", adapt=a)) == b""


_CHILD = """
import sys
from bytemodel import compress as bmz
from bytemodel.compress.adapt import Fresh, settings
lm = Fresh("tiny", d_model=32, n_layers=2, n_heads=2, d_ff=64)
mode, src, dst, workers = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
data = open(src, 'rb').read()
out = (bmz.compress(lm, data, adapt=settings(lm, segment=8, stride=2), streams=4, lane=1, workers=workers) if mode == 'c'
       else bmz.decompress(lm, data, workers=workers))
open(dst, 'wb').write(out)
"""


def _child(mode, src, dst, workers, blas):
    path = os.pathsep.join([str(ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])
    env = dict(os.environ, PYTHONPATH=path, OPENBLAS_NUM_THREADS=str(blas), OMP_NUM_THREADS=str(blas))
    r = subprocess.run([sys.executable, "-c", _CHILD, mode, str(src), str(dst), str(workers)],
                       env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr


def test_same_bytes_across_threads_and_processes(fresh, tmp_path):
    data = TEXT[:600]
    a = settings(fresh, segment=8, stride=2)                    # lanes of one stream: half of them idle each update
    one = bmz.compress(fresh, data, adapt=a, streams=4, lane=1, workers=1)     # 4 lanes on one thread
    two = bmz.compress(fresh, data, adapt=a, streams=4, lane=1, workers=2)     # the same lanes on two
    assert one == two
    src = tmp_path / "in.txt"
    src.write_bytes(data)
    _child("c", src, tmp_path / "c.bmz", 2, 2)                  # another process, 2 threads, 2 BLAS threads
    assert (tmp_path / "c.bmz").read_bytes() == one
    _child("d", tmp_path / "c.bmz", tmp_path / "back", 1, 1)    # compressed on 2 threads, decompressed on 1
    assert (tmp_path / "back").read_bytes() == data
    assert bmz.decompress(fresh, one, workers=2) == data        # compressed on 1, decompressed on 2


def test_from_a_checkpoint_and_the_refusals(run_dir, fresh, tmp_path):
    lm = bytemodel.load(run_dir)
    a = settings(lm, segment=4)
    assert a.start == "checkpoint" and a.lr == 3e-4
    data = b"ACGTTGCAAGGT" * 20 + b"a different tail " * 5
    blob = bmz.compress(lm, data, adapt=a, streams=2)
    assert bmz.decompress(lm, blob) == data
    assert bmz.read(blob)[0]["layout"]["window"] == 32 and a.stride == 1   # a checkpoint: the CPU's defaults
    with pytest.raises(CompressError, match="adapted from checkpoint"):
        bmz.decompress(fresh, blob)                             # a fresh model is not the checkpoint
    with pytest.raises(CompressError, match="preset tiny"):
        bmz.decompress(lm, bmz.compress(fresh, data[:100], adapt=settings(fresh)))
    lie = bmz.read(blob)
    for edit in (lambda h: h["adapt"].update(segment=0), lambda h: h["adapt"].update(optimizer="lion"),
                 lambda h: h["adapt"].update(stride=0), lambda h: h["adapt"].update(stride=True),
                 lambda h: h["adapt"].update(extra=1), lambda h: h["layout"].update(engine="lockstep", reread=3)):
        h = {**lie[0], "adapt": dict(lie[0]["adapt"]), "layout": dict(lie[0]["layout"])}
        edit(h)
        with pytest.raises(CompressError, match="malformed"):
            bmz.decompress(lm, bmz._pack(h, lie[1]))
    h = {**lie[0], "adapt": {**lie[0]["adapt"], "lr": 1e-3}}     # other settings: other weights, other symbols
    with pytest.raises(CompressError):
        bmz.decompress(lm, bmz._pack(h, lie[1]))
    with pytest.raises(ConfigError):
        Adapt(segment=0)
    # the lockstep engine (the GPU's) adapts too: the steppers take the new weights after each update
    lock = bmz.compress(lm, data, adapt=a, streams=2, engine="lockstep")
    assert bmz.read(lock)[0]["layout"]["engine"] == "lockstep"
    assert lock == bmz.compress(lm, data, adapt=a, streams=2, engine="lockstep")
    assert bmz.decompress(lm, lock) == data
    learnt, static = {}, {}                                     # the network alone (no mixer): only
    bmz.compress(lm, data, adapt=settings(lm, segment=4, mix="none"), streams=2, engine="lockstep",
                 stats=learnt)                                 # the weights' updates can lower its bits
    bmz.compress(lm, data, streams=2, engine="lockstep", stats=static)
    assert learnt["model_bits"] < static["model_bits"]          # the updates reached the steppers


def test_an_update_trains_one_stream_in_stride_in_turn(fresh):
    from bytemodel.compress.adapt import Adapter
    ad = Adapter(fresh.model, [fresh.model], [(0, 3), (3, 6)], [10] * 6, Adapt(stride=3), 256)
    got = []
    for u in range(4):
        ad.updates = u
        got.append([ad._rows(0, 3).tolist(), ad._rows(3, 6).tolist()])
    assert got == [[[0], [3]], [[1], [4]], [[2], [5]], [[0], [3]]]     # s % 3 == update % 3, in each lane
    assert Adapter(fresh.model, [fresh.model], [(0, 6)], [10] * 6, Adapt(), 256)._rows(0, 6).tolist() == list(range(6))


def test_stride_round_trips_and_is_in_the_container(fresh):
    data = TEXT[:600]
    every = bmz.compress(fresh, data, adapt=settings(fresh, segment=8, stride=1), streams=4, lane=2)
    some = bmz.compress(fresh, data, adapt=settings(fresh, segment=8, stride=3), streams=4, lane=2)
    assert every != some                                        # the updates saw other streams: other weights
    assert bmz.read(some)[0]["adapt"]["stride"] == 3 and bmz.decompress(fresh, some) == data
    h, payload = bmz.read(some)
    with pytest.raises(CompressError):                          # decoded with the other stride: not the file
        bmz.decompress(fresh, bmz._pack({**h, "adapt": {**h["adapt"], "stride": 1}}, payload))
    wide = bmz.compress(fresh, data, adapt=settings(fresh, segment=8, stride=5), streams=2)
    assert bmz.decompress(fresh, wide) == data                  # more stride than streams: some updates train none
    assert settings(fresh).stride == 8 and settings(fresh, stride=2).stride == 2
    lay = bmz.read(bmz.compress(fresh, data[:100], adapt=settings(fresh), streams=4))[0]["layout"]
    assert (lay["window"], lay["lane"]) == (16, 4)              # a fresh start's layout: layout.FRESH_WINDOW, one lane
    with pytest.raises(ConfigError):
        Adapt(stride=0)


def _elsewhere_on_the_fixtures_blas(h: dict, here: dict, test: str) -> None:
    """A fixture's float bits are its NumPy's and BLAS's. On another machine: where the fixture was
    made under OpenBLAS's Haswell kernels and this CPU has AVX2, run `test` again in a process that
    asks OpenBLAS for them (OPENBLAS_CORETYPE), and pass or fail with it; otherwise skip."""
    made = str(h["backend"].get("blas", ""))
    flags = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    if ("openblas" in made and "Haswell" in made and os.environ.get("OPENBLAS_CORETYPE") != "Haswell"
            and " avx2" in flags and "openblas" in str(here.get("blas", ""))):
        env = dict(os.environ, OPENBLAS_CORETYPE="Haswell",
                   PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
        r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs",
                            f"tests/test_adapt.py::{test}"], cwd=ROOT, env=env, capture_output=True, text=True,
                           timeout=300)
        assert r.returncode == 0 and " passed" in r.stdout, r.stdout[-3000:] + r.stderr[-2000:]
        return
    pytest.skip(f"the fixture was made with {h['backend']}; this machine has {here}")


def test_a_file_from_before_the_stride_still_decodes():
    # tests/fixtures/adapt_v1.txt.bmz: made by `bmz.compress(Fresh("tiny"), text, adapt=settings(lm),
    # streams=2)` at d44a593 (before the stride field and the mixer's thread; its header has no "stride")
    blob = (ROOT / "tests/fixtures/adapt_v1.txt.bmz").read_bytes()
    h = bmz.read(blob)[0]
    assert "stride" not in h["adapt"] and h["adapt"]["mix"] == "ctx2"
    lm = Fresh("tiny")
    here = lm.model.ops.describe()
    if {k: h["backend"].get(k) for k in here} != here:          # the float bits are NumPy's and BLAS's
        return _elsewhere_on_the_fixtures_blas(h, here, "test_a_file_from_before_the_stride_still_decodes")
    assert bmz.decompress(lm, blob) == (ROOT / "tests/fixtures/adapt_v1.txt").read_bytes()


def test_a_file_from_the_fifth_session_still_decodes():
    # tests/fixtures/adapt_v2.txt.bmz: made by `bmz.compress(Fresh("tiny"), text, adapt=settings(lm),
    # streams=2)` at b327d1d (stride 8, window 16 in one lane, the mixer on its thread)
    blob = (ROOT / "tests/fixtures/adapt_v2.txt.bmz").read_bytes()
    h = bmz.read(blob)[0]
    assert h["adapt"]["stride"] == 8 and h["layout"]["window"] == 16 and h["adapt"]["mix"] == "ctx2"
    lm = Fresh("tiny")
    here = lm.model.ops.describe()
    if {k: h["backend"].get(k) for k in here} != here:          # the float bits are NumPy's and BLAS's
        return _elsewhere_on_the_fixtures_blas(h, here, "test_a_file_from_the_fifth_session_still_decodes")
    text = (ROOT / "tests/fixtures/adapt_v2.txt").read_bytes()
    assert bmz.decompress(lm, blob) == text
    # and today's code, given the file's mixer (ctx2; the default is now ctx3), makes the same
    # payload and the same header, in container version 4
    now = bmz.read(bmz.compress(lm, text, adapt=settings(lm, mix="ctx2"), streams=2))
    then = bmz.read(blob)
    assert now[1] == then[1] and {**now[0], "version": 3} == then[0]


def test_the_cli_keeps_freed_memory_on_glibc(tmp_path):
    # cli/memory.roomy_malloc (main() sets it for every command): the same compression in two processes, with and without it; with
    # it the process faults far fewer pages in (the mixer's large temporaries are reused, not handed
    # back to the kernel each step). Page faults, not time: the count does not depend on the load.
    import platform
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        pytest.skip("mallopt is glibc's")
    f = tmp_path / "t.txt"
    f.write_bytes((ROOT / "docs/ARCHITECTURE.md").read_bytes()[:8000])
    script = """
import resource, sys
import bytemodel.compress.driver as bmz
from bytemodel.cli.memory import roomy_malloc
from bytemodel.compress.adapt import Fresh, settings
if sys.argv[1] == "roomy":
    assert roomy_malloc()
lm, data = Fresh("tiny"), open(sys.argv[2], "rb").read()
f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
blob = bmz.compress(lm, data, adapt=settings(lm))
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0, len(blob))
"""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = {m: subprocess.run([sys.executable, "-c", script, m, str(f)], capture_output=True, text=True, env=env,
                             check=True).stdout.split() for m in ("plain", "roomy")}
    assert out["plain"][1] == out["roomy"][1]                    # (the same file either way)
    assert int(out["roomy"][0]) < int(out["plain"][0]) / 2, out   # 8 KB: ~12,000 against ~59,000


def test_every_command_keeps_freed_memory():
    # main() sets roomy_malloc before any command runs: three 4 MB temporaries made and freed 20
    # times fault their pages in about once (~1,500), not each time (~30,000) as glibc's defaults do.
    import platform
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        pytest.skip("mallopt is glibc's")
    script = """
import resource, sys
import numpy as np
from bytemodel import cli
if sys.argv[1] == "main":
    sys.argv = ["bytemodel", "--help"]
    try:
        cli.main()
    except SystemExit:
        pass
f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(20):
    a, b, c = (np.ones(1 << 20, dtype=np.float32) for _ in range(3))
    del a, b, c                 # 12 MB free at the heap's top: past glibc's own trim threshold
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)
"""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    faults = {m: int(subprocess.run([sys.executable, "-c", script, m], capture_output=True, text=True, env=env,
                                    check=True).stdout.split()[-1]) for m in ("plain", "main")}
    assert faults["plain"] > 15_000 and faults["main"] < 5_000, faults


def test_the_mixer_thread_changes_no_bit(fresh, monkeypatch):
    from bytemodel.compress import driver
    data = TEXT[:500]
    a = settings(fresh, segment=8, stride=2)
    side = bmz.compress(fresh, data, adapt=a, streams=3, lane=2)
    monkeypatch.setattr(driver, "MIXER_THREAD", False)          # the mixer in turn on the calling thread
    assert bmz.compress(fresh, data, adapt=a, streams=3, lane=2) == side
    assert bmz.decompress(fresh, side) == data
    for mix in ("ctx1", "ctx2", "ctx3"):                        # every mixer splits its prediction alike
        b = settings(fresh, segment=8, mix=mix)
        turn = bmz.compress(fresh, data, adapt=b, streams=3)
        monkeypatch.setattr(driver, "MIXER_THREAD", True)
        assert bmz.compress(fresh, data, adapt=b, streams=3) == turn
        monkeypatch.setattr(driver, "MIXER_THREAD", False)


def test_another_backend_is_refused(run_dir):
    import importlib.util
    spec = importlib.util.find_spec("bytemodel.ops.numpy_ops")
    ops = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ops)
    h200 = {"device": "cuda", "precision": "fp16", "gpu": "NVIDIA H200", "sm_count": 132}
    ops.describe = lambda: h200
    lm = bytemodel.load(run_dir)
    data = b"ACGT" * 30
    blob = bmz.compress(lm, data, adapt=settings(lm))          # on the CPU
    lm.model.ops = ops                                          # NumPy underneath, "an H200" to the container
    gpu_blob = bmz.compress(lm, data, adapt=settings(lm))
    assert bmz.read(gpu_blob)[0]["layout"]["engine"] == "lockstep"
    with pytest.raises(CompressError, match="compressed on cpu"):
        bmz.decompress(lm, blob)
    assert bmz.decompress(lm, gpu_blob) == data
    ops.describe = lambda: {**h200, "gpu": "NVIDIA H100 80GB HBM3"}
    with pytest.raises(CompressError, match="adapted on NVIDIA H200"):
        bmz.decompress(lm, gpu_blob)
    ops.describe = lambda: {**h200, "sm_count": 114}
    with pytest.raises(CompressError, match="adapted on NVIDIA H200"):
        bmz.decompress(lm, gpu_blob)






def test_cli_adapt_without_a_checkpoint(run_dir, tmp_path):
    f = tmp_path / "t.txt"
    f.write_bytes(TEXT[:300])
    code, out = _cli(["compress", f, "--adapt", "--preset", "tiny", "--adapt-segment", 8])
    assert code == 0 and ("adapting, adamw lr 0.002 every 8 tokens on 1 stream in 8 from preset tiny, mixed with "
                          "the file's counts") in out, out
    assert bmz.read((tmp_path / "t.txt.bmz").read_bytes())[0]["adapt"]["mix"] == "ctx3"
    code, out = _cli(["compress", f, "--adapt", "--preset", "tiny", "--adapt-stride", 1, "-o", tmp_path / "s.bmz"])
    assert code == 0 and "every 32 tokens from preset tiny" in out, out
    assert bmz.read((tmp_path / "s.bmz").read_bytes())[0]["adapt"]["stride"] == 1
    code, out = _cli(["compress", f, "--adapt", "--preset", "tiny", "--adapt-mix", "none", "-o", tmp_path / "n.bmz"])
    assert code == 0 and "the network alone" in out, out
    assert bmz.read((tmp_path / "n.bmz").read_bytes())[0]["adapt"]["mix"] == "none"
    code, out = _cli(["compress", f, "--adapt", "--preset", "tiny", "--precision", "bf16", "-o", tmp_path / "p.bmz"])
    assert code == 0, out                                         # the CPU computes in fp32 whatever is asked
    assert bmz.read((tmp_path / "p.bmz").read_bytes())[0]["backend"]["precision"] == "fp32"
    f.rename(tmp_path / "orig.txt")
    code, out = _cli(["decompress", tmp_path / "t.txt.bmz"])    # no checkpoint: the header names the preset
    assert code == 0, out
    assert f.read_bytes() == TEXT[:300]
    code, out = _cli(["decompress", tmp_path / "t.txt.bmz", "-c", run_dir, "-o", tmp_path / "w"])
    assert code != 0 and _one_error_line(out) and not (tmp_path / "w").exists(), out
    for bad in (["--preset", "tiny"], ["--adapt", "--device", "cuda"], ["--adapt", "--preset", "huge"],
                ["--adapt", "--preset", "tiny", "-c", run_dir], ["--adapt", "--preset", "tiny", "--adapt-mix", "ctx9"],
                ["--adapt-mix", "none"], ["--adapt", "--preset", "tiny", "--adapt-stride", 0], ["--adapt-stride", 2]):
        code, out = _cli(["compress", tmp_path / "orig.txt", "-o", tmp_path / "x.bmz", *bad])
        assert code != 0 and _one_error_line(out) and not (tmp_path / "x.bmz").exists(), (bad, out)
    code, out = _cli(["score", tmp_path / "orig.txt", "--adapt", "--preset", "tiny"])
    assert code == 0 and "bits/byte" in out, out
    code, out = _cli(["eval", tmp_path / "orig.txt", "--adapt", "--preset", "tiny", "--json"])
    assert code == 0 and '"adapt"' in out, out


def test_adapt_streams_are_long_on_the_cpu_and_wide_on_a_gpu():
    # --adapt's default stream count (compress/layout.py): on the CPU at least ADAPT_STREAM tokens a
    # stream and at most ADAPT_MAX_STREAMS; on a GPU at least GPU_ADAPT_STREAM and at most
    # GPU_ADAPT_MAX_STREAMS (a GPU's step costs about the same at 64 rows as at 1,024)
    from bytemodel.compress import layout as L
    assert L.adapt_streams(0) == 0 and L.adapt_streams(0, "cuda") == 0
    assert L.adapt_streams(100) == 1 and L.adapt_streams(100, "cuda") == 1
    assert L.adapt_streams(4_000_000) == L.ADAPT_MAX_STREAMS == 64
    assert L.adapt_streams(4_000_000, "cuda") == L.GPU_ADAPT_MAX_STREAMS == 1024
    assert L.adapt_streams(1_000_000, "cuda") == 1_000_000 // L.GPU_ADAPT_STREAM == 488
    assert L.adapt_streams(20_000) == 20_000 // L.ADAPT_STREAM
