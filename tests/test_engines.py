"""Every hand-written copy of the transformer block (Model.block, the CPU compressor's engine, the
GPU decoder, the CPU's one-token generation step) declares which ModelConfig fields it follows and which cannot change what it computes;
the declarations must cover exactly ModelConfig's fields, so a new architecture setting fails here
until every engine says what it does with it, instead of one engine silently diverging."""
from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

from bytemodel.config import ModelConfig

PKG = Path(__file__).resolve().parents[1] / "bytemodel"
ENGINES = ["model.py", "compress/cpu_engine.py", "ops/cuda_decode.py", "decode/cpu_step.py"]


def declared(rel: str) -> tuple[set, dict]:
    """FOLLOWS and IGNORES of an engine module, read from its source (the GPU decoder imports CuPy)."""
    tree = ast.parse((PKG / rel).read_text())
    found = {t.id: ast.literal_eval(n.value) for n in tree.body if isinstance(n, ast.Assign)
             for t in n.targets if isinstance(t, ast.Name) and t.id in ("FOLLOWS", "IGNORES")}
    assert set(found) == {"FOLLOWS", "IGNORES"}, f"{rel} declares {sorted(found)}"
    return set(found["FOLLOWS"]), found["IGNORES"]


@pytest.mark.parametrize("rel", ENGINES)
def test_each_engine_declares_every_model_setting(rel):
    fields = {f.name for f in dataclasses.fields(ModelConfig)}
    follows, ignores = declared(rel)
    assert not follows & set(ignores), f"{rel}: both followed and ignored: {follows & set(ignores)}"
    assert follows | set(ignores) == fields, (f"{rel}: undeclared {sorted(fields - follows - set(ignores))}, "
                                              f"unknown {sorted((follows | set(ignores)) - fields)}")
    assert all(isinstance(why, str) and why for why in ignores.values())   # each with its reason


def test_a_new_setting_would_fail(monkeypatch):
    """The check itself: a ModelConfig with one more field leaves it undeclared in every engine."""
    Wider = dataclasses.make_dataclass("Wider", [("new_flag", bool, False)], bases=(ModelConfig,))
    fields = {f.name for f in dataclasses.fields(Wider)}
    for rel in ENGINES:
        follows, ignores = declared(rel)
        assert fields - follows - set(ignores) == {"new_flag"}
