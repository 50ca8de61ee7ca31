"""The resume checkpoint: the loop's own decisions are in its training state (older files without
them still resume, a crafted loop state is refused); the checksum covers every tensor and all
metadata; a file of the wrong shape is one error line; a save killed at any point leaves a whole
checkpoint that resumes bit-identically (fault injection, issue 17)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import bytemodel
from bytemodel import checkpoint as ck
from bytemodel.errors import CheckpointError, ConfigError
from conftest import CORE_FILES, MODEL_SETTINGS, cli, dna, refused, subprocess_env


def _rewrite(path, **train):
    ld = ck.load(path)
    ck.save(path / ck.CKPT_NAME, ld.cfg, ld.tokenizer, ld.params, train, ld.m, ld.v)


def test_loop_state_is_saved_and_an_older_checkpoint_resumes_the_same(tmp_path, dna_file, fast_settings):
    straight = bytemodel.train(dna_file, tmp_path / "a", steps=10, **fast_settings)
    assert ck.load(straight.checkpoint).train["loop"] == {"planned_steps": 10, "lr_from": [],
                                                        "stop_reason": "finished 10 steps", "cuts": [],
                                                        "eval_every": 0}
    part = bytemodel.train(dna_file, tmp_path / "b", steps=10, stop_at=4, **fast_settings)
    st = ck.load(part.checkpoint).train
    assert st["loop"]["planned_steps"] == 10 and st["loop"]["stop_reason"].startswith("interrupted: saved step 4")
    # as a checkpoint written before the loop state existed: the plan was the settings' steps
    old = {k: v for k, v in st.items() if k != "loop"}
    _rewrite(tmp_path / "b", **old)
    resumed = bytemodel.train(None, tmp_path / "b", resume=True)
    assert resumed.step == 10 and resumed.stop_reason == "finished 10 steps"
    assert np.array_equal(ck.load(resumed.checkpoint).params, ck.load(straight.checkpoint).params)


@pytest.mark.parametrize("loop", [{"planned_steps": 0}, {"planned_steps": True}, {"planned_steps": "9"},
                                  {"planned_steps": 9, "stop_reason": 3}, [9],
                                  {"planned_steps": 9, "lr_from": [1]}, {"planned_steps": 9, "lr_from": [1.5, 1e-3]},
                                  {"planned_steps": 9, "lr_from": [-1, 1e-3]}, {"planned_steps": 9, "lr_from": [1, "x"]},
                                  {"planned_steps": 9, "lr_from": {"step": 1}},
                                  {"planned_steps": 9, "cuts": [0]}, {"planned_steps": 9, "cuts": [3]},
                                  {"planned_steps": 9, "cuts": [1, 1]}, {"planned_steps": 9, "cuts": [True]},
                                  {"planned_steps": 9, "cuts": "1"}])
def test_a_crafted_loop_state_is_refused(tmp_path, dna_file, fast_settings, loop):
    part = bytemodel.train(dna_file, tmp_path / "r", steps=8, stop_at=2, **fast_settings)
    _rewrite(tmp_path / "r", **{**ck.load(part.checkpoint).train, "loop": loop})
    with pytest.raises(CheckpointError, match="loop state"):
        bytemodel.train(None, tmp_path / "r", resume=True)


# ================================================================================================
# the checksum covers every tensor (AdamW moments included) and all metadata
# ================================================================================================
def tensor_span(path: Path, name: str) -> tuple[int, int]:
    """Byte range of one tensor's data inside a safetensors file."""
    blob = path.read_bytes()
    n = int.from_bytes(blob[:8], "little")
    header = json.loads(blob[8:8 + n])
    a, b = header[name]["data_offsets"]
    return 8 + n + a, 8 + n + b


def rewrite_meta(path: Path, edit) -> None:
    """Re-save a checkpoint with its metadata changed by edit(meta) (tensors untouched)."""
    from safetensors.numpy import load, save
    blob = path.read_bytes()
    n = int.from_bytes(blob[:8], "little")
    meta = json.loads(json.loads(blob[8:8 + n])["__metadata__"]["bytemodel"])
    meta = edit(meta)
    path.write_bytes(save(load(blob), metadata={"bytemodel": json.dumps(meta)}))


@pytest.mark.parametrize("tensor", ["optim.m", "optim.v", "wte"])
def test_a_flipped_byte_in_any_tensor_is_refused(run_copy, tensor):
    path = run_copy / ck.CKPT_NAME
    a, b = tensor_span(path, tensor)
    blob = bytearray(path.read_bytes())
    blob[(a + b) // 2] ^= 0x10
    path.write_bytes(bytes(blob))
    with pytest.raises(CheckpointError, match="corrupt"):
        ck.load(run_copy)


@pytest.mark.parametrize("edit", [
    lambda m: {**m, "train": {**m["train"], "step": 4}},
    lambda m: {**m, "config": {**m["config"], "context": 16}},
    lambda m: {**m, "config": {**m["config"], "rope_theta": 500.0}},
    lambda m: {**m, "config": {**m["config"], "norm_eps": 1e-3}},
    lambda m: {**m, "train": {**m["train"], "config": {**m["train"]["config"], "lr": 0.5}}},
    lambda m: {**m, "train": {**m["train"], "config": {**m["train"]["config"], "seed": 7}}},
    lambda m: {**m, "tokenizer": {**m["tokenizer"], "pre_split": "text"}},
], ids=["step", "context", "rope_theta", "norm_eps", "lr", "seed", "tokenizer"])
def test_edited_metadata_is_refused(run_copy, edit):
    rewrite_meta(run_copy / ck.CKPT_NAME, edit)
    with pytest.raises(CheckpointError, match="corrupt"):
        ck.load(run_copy)


def test_untouched_checkpoint_still_loads_with_moments(trained):
    ld = ck.load(trained)
    assert ld.m is not None and ld.train["step"] == 5 and np.isfinite(ld.params).all()


def test_a_version_1_checkpoint_still_loads_and_its_weights_are_verified(tmp_path):
    """Models trained before the checksum covered everything stay usable: version 1 files load,
    their weights checked against the weights-only checksum they carry; a flipped weight is refused."""
    import json as _json
    from safetensors.numpy import save as st_save
    from bytemodel import checkpoint as ck
    from bytemodel.config import ModelConfig
    from bytemodel.errors import CheckpointError
    from bytemodel.model import Model, layout
    from bytemodel.ops import numpy_ops
    from bytemodel.tokenizer import Tokenizer
    cfg = ModelConfig(d_model=16, n_layers=1, n_heads=2, d_ff=16, context=8)
    m = Model(cfg, numpy_ops)
    m.init_weights(0)
    flat = np.asarray(m.params, dtype=np.float32)
    tensors = {n: np.ascontiguousarray(flat[o:o + int(np.prod(s))].reshape(s)) for n, s, o in layout(cfg)}
    meta = {"format": ck.FORMAT, "version": 1, "config": cfg.to_dict(), "tokenizer": Tokenizer().to_dict(),
            "train": {"step": 3}, "params_sha256": ck._sha(flat)}
    good = tmp_path / "v1.safetensors"
    good.write_bytes(st_save(tensors, metadata={"bytemodel": _json.dumps(meta)}))
    loaded = ck.load(good)
    assert np.array_equal(loaded.params, flat) and loaded.train["step"] == 3
    tensors["wte"] = tensors["wte"].copy()
    tensors["wte"][0, 0] += 1.0
    bad = tmp_path / "v1bad.safetensors"
    bad.write_bytes(st_save(tensors, metadata={"bytemodel": _json.dumps(meta)}))
    with pytest.raises(CheckpointError, match="corrupt"):
        ck.load(bad)



# ================================================================================================
# metadata and training state of the wrong shape: one error line
# ================================================================================================
@pytest.mark.parametrize("meta", ["null", "[1, 2]", '"text"', "{\"format\": \"bytemodel-checkpoint\", "
                                  "\"version\": 2, \"config\": [], \"tokenizer\": null, \"train\": 3}"])
def test_checkpoint_metadata_of_the_wrong_shape(run_copy, meta):
    from safetensors.numpy import load, save
    path = run_copy / ck.CKPT_NAME
    path.write_bytes(save(load(path.read_bytes()), metadata={"bytemodel": meta}))
    for args in (["info", run_copy, "--last"], ["generate", "-c", run_copy, "--last", "--bytes", "3"],
                 ["train", "--resume", "--out", run_copy, "--steps", "8", "-q"]):   # the file broken
        assert refused(*cli(args), str(run_copy)), args


@pytest.mark.parametrize("state", [[1, 2], {"step": "five"}, {"step": 5, "config": None},
                                   {"step": 5, "config": [1]}, {"step": 5, "config": {"lr": "x"}},
                                   {"step": 5, "config": {"no_such_setting": 1}}])
def test_checkpoint_train_state_of_the_wrong_shape_with_a_valid_checksum(run_copy, state):
    ld = ck.load(run_copy)
    ck.save(run_copy / ck.CKPT_NAME, ld.cfg, ld.tokenizer, ld.params, state, ld.m, ld.v)
    code, out = cli(["train", "--resume", "--out", run_copy, "--steps", "8", "-q"])
    assert refused(code, out), out
    assert refused(*cli(["info", run_copy])) or cli(["info", run_copy])[0] == 0


def test_workers_from_a_crafted_checkpoint_are_bounded(run_copy):
    from bytemodel.training.prepare import TrainConfig, prepare
    ld = ck.load(run_copy)
    state = {**ld.train, "config": {**ld.train["config"], "workers": 10 ** 6}}
    ck.save(run_copy / ck.CKPT_NAME, ld.cfg, ld.tokenizer, ld.params, state, ld.m, ld.v)
    with pytest.raises(ConfigError, match="workers"):
        prepare(TrainConfig(out_dir=str(run_copy), steps=8), resume=True)



# ================================================================================================
# kill during save, over and over: each resume continues bit-identically, leaving nothing behind
# ================================================================================================
KILLER = r"""
import os, signal, stat, sys
mode, nth, out, src, resume = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5] == "1"
import bytemodel
from bytemodel import checkpoint as ck
seen = 0
real_fsync, real_replace = os.fsync, os.replace

def our_save():
    return any(f.f_code.co_name == "save" and "checkpoint" in f.f_code.co_filename for f in _frames())

def _frames():
    f = sys._getframe(2)
    while f is not None:
        yield f
        f = f.f_back

def fsync(fd):
    global seen
    if mode == "torn" and stat.S_ISREG(os.fstat(fd).st_mode) and our_save():
        seen += 1
        if seen == nth:                       # half the bytes reached the disk, then the power went
            os.truncate(os.readlink(f"/proc/self/fd/{fd}"), os.fstat(fd).st_size // 2)
            os.kill(os.getpid(), signal.SIGKILL)
    return real_fsync(fd)

def replace(a, b):
    global seen
    if str(b).endswith(ck.CKPT_NAME) and mode in ("before-rename", "after-rename"):
        seen += 1
        if seen == nth and mode == "before-rename":
            os.kill(os.getpid(), signal.SIGKILL)
        real_replace(a, b)
        if seen == nth:
            os.kill(os.getpid(), signal.SIGKILL)
        return
    return real_replace(a, b)

os.fsync, os.replace = fsync, replace
settings = dict(preset="tiny", context=32, batch_size=4, eval_every=2, eval_tokens=128, warmup=2,
                model={"d_model": 32, "n_layers": 2, "n_heads": 2, "d_ff": 64})
if resume:
    bytemodel.train(None, out, resume=True, steps=12)
else:
    bytemodel.train(src, out, steps=12, **settings)
print("finished")
"""


def test_kill_during_save_again_and_again(tmp_path):
    import bytemodel
    src = dna(tmp_path / "d.txt")
    settings = dict(MODEL_SETTINGS, eval_every=2, eval_tokens=128)
    ref = tmp_path / "straight"
    bytemodel.train(src, ref, steps=12, **settings)
    want = ck.load(ref)

    run = tmp_path / "killed"
    schedule = [("torn", 2), ("before-rename", 1), ("after-rename", 2), ("torn", 1)]
    last_step = 0
    for i, (mode, nth) in enumerate(schedule):
        p = subprocess.run([sys.executable, "-c", KILLER, mode, str(nth), str(run), str(src), "1" if i else "0"],
                           capture_output=True, text=True, timeout=120, env=subprocess_env())
        assert p.returncode == -signal.SIGKILL, (mode, p.returncode, p.stdout, p.stderr[-2000:])
        ld = ck.load(run)                   # whatever the kill hit, a whole checkpoint is there
        step = ld.train["step"]
        assert step >= last_step and step % 2 == 0, (mode, step)
        last_step = step
    p = subprocess.run([sys.executable, "-c", KILLER, "none", "0", str(run), str(src), "1"],
                       capture_output=True, text=True, timeout=120, env=subprocess_env())
    assert p.returncode == 0 and "finished" in p.stdout, p.stderr[-2000:]
    got = ck.load(run)
    assert got.train["step"] == 12
    assert np.array_equal(got.params, want.params)          # bit for bit, after four kills
    assert np.array_equal(got.m, want.m) and np.array_equal(got.v, want.v)
    steps = [json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert steps == list(range(1, 13))
    assert set(os.listdir(run)) == CORE_FILES                # no temp file survives



def test_an_extended_schedule_is_saved_and_older_checkpoints_extend_the_same(tmp_path, dna_file, fast_settings):
    """Resuming 6 -> 12 extends the schedule (LoopState.lr_from, in the checkpoint's "loop"); a run
    interrupted inside the extension resumes on it, to the same weights; a checkpoint from before
    lr_from existed, or before the loop state, extends the same way."""
    import json
    for name in ("a", "b", "c", "d"):
        bytemodel.train(dna_file, tmp_path / name, steps=6, **fast_settings)
    straight = bytemodel.train(None, tmp_path / "a", resume=True, steps=12)
    lf = ck.load(straight.checkpoint).train["loop"]["lr_from"]
    assert lf and lf[0] == 6
    bytemodel.train(None, tmp_path / "b", resume=True, steps=12, stop_at=9)
    assert ck.load(tmp_path / "b").train["loop"]["lr_from"] == lf
    bytemodel.train(None, tmp_path / "b", resume=True)                   # on to 12 on the extension
    st = ck.load(tmp_path / "c").train
    _rewrite(tmp_path / "c", **{**st, "loop": {k: v for k, v in st["loop"].items() if k != "lr_from"}})
    _rewrite(tmp_path / "d", **{k: v for k, v in ck.load(tmp_path / "d").train.items() if k != "loop"})
    for name in ("c", "d"):
        bytemodel.train(None, tmp_path / name, resume=True, steps=12)
    want = ck.load(straight.checkpoint).params

    def lrs(name):
        return [json.loads(ln)["lr"] for ln in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
    for name in ("b", "c", "d"):
        assert np.array_equal(ck.load(tmp_path / name).params, want), name
        assert lrs(name) == lrs("a"), name
