"""The resume checkpoint's training state: the loop's own decisions are in it, older files without
them still resume, and a crafted loop state is refused."""
import numpy as np
import pytest

import bytemodel
from bytemodel import checkpoint as ck
from bytemodel.errors import CheckpointError


def _rewrite(path, **train):
    ld = ck.load(path)
    ck.save(path / ck.CKPT_NAME, ld.cfg, ld.tokenizer, ld.params, train, ld.m, ld.v)


def test_loop_state_is_saved_and_an_older_checkpoint_resumes_the_same(tmp_path, dna_file, fast_settings):
    straight = bytemodel.train(dna_file, tmp_path / "a", steps=10, **fast_settings)
    assert ck.load(straight.checkpoint).train["loop"] == {"planned_steps": 10, "stop_reason": "finished 10 steps"}
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
                                  {"planned_steps": 9, "stop_reason": 3}, [9]])
def test_a_crafted_loop_state_is_refused(tmp_path, dna_file, fast_settings, loop):
    part = bytemodel.train(dna_file, tmp_path / "r", steps=8, stop_at=2, **fast_settings)
    _rewrite(tmp_path / "r", **{**ck.load(part.checkpoint).train, "loop": loop})
    with pytest.raises(CheckpointError, match="loop state"):
        bytemodel.train(None, tmp_path / "r", resume=True)
