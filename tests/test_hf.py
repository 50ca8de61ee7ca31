"""Hugging Face export / import: names, shapes, layouts, round trips, refusals; and, where torch and
transformers are installed (skipped cleanly otherwise), transformers itself loading the export and
computing what we compute.
"""
import functools
import json
import re
import shutil

import numpy as np
import pytest
from typer.testing import CliRunner

from bytemodel import checkpoint as ck
from bytemodel.cli import app
from bytemodel.config import ModelConfig
from bytemodel.errors import ConfigError, TokenizerError
from bytemodel.hf import export_hf, import_hf
from bytemodel.hf.layout import config_from_hf
from bytemodel.hf.tokenizer_json import byte_alphabet, read_tokenizer_json, token_string
from bytemodel.model import Model, layout
from bytemodel.ops import numpy_ops
from bytemodel.tokenizer import Tokenizer

runner = CliRunner()

# Small models with non-default settings everywhere a wrong mapping would hide: eps 2e-5 (HF's
# default is 1e-6, ours 1e-5), theta 500, odd widths, 2 layers so layer order matters.
CASES = {
    "plain": dict(d_model=32, n_layers=2, n_heads=4, d_ff=48),
    "gqa": dict(d_model=48, n_layers=2, n_heads=6, n_kv_heads=2, d_ff=40),
    "tied": dict(d_model=32, n_layers=2, n_heads=2, d_ff=56, tie_embeddings=True),
    "bpe": dict(d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=48),
    "mtp": dict(d_model=32, n_layers=2, n_heads=4, d_ff=48, mtp=3),     # two MTP heads (issue 14)
}
COMMON = dict(context=64, norm_eps=2e-5, rope_theta=500.0)

WORDS = ["the", "cat", "sat", "on", "mat", "café", "naïve", "日本語", "x=1", "42", "1999", "don't",
         "it's", "\t", "  ", "\n", "über", "🙂", "fox", "dog", "(a)", "...", "a-b"]


def sample_text(rng, n_words: int) -> str:
    return " ".join(WORDS[i] for i in rng.integers(0, len(WORDS), n_words))


@functools.lru_cache(maxsize=None)
def _merges(kind: str):
    data = sample_text(np.random.default_rng(1), 3000).encode()
    tok = Tokenizer.train([data], 60, pre_split="text" if kind == "text" else None)
    return tuple(tok.merges), tok.pre_split


def make_tokenizer(kind: str):
    if kind == "bytes":
        return Tokenizer()
    merges, pre_split = _merges(kind)
    return Tokenizer(list(merges), pre_split)


def make_run(root, case: str, tok_kind: str | None = None, seed: int = 0):
    """A checkpoint with random weights of a scale that gives logits of order 1..10, and gains
    that are not 1 (so a swapped norm shows)."""
    tok = make_tokenizer(tok_kind or ("text" if case == "bpe" else "bytes"))
    cfg = ModelConfig(vocab_size=tok.vocab_size, **CASES[case], **COMMON)
    m = Model(cfg, numpy_ops)
    rng = np.random.default_rng(seed)
    for name, shape, _ in layout(cfg):
        if len(shape) == 1:
            m.p[name][...] = 1 + 0.3 * rng.standard_normal(shape)
        else:
            m.p[name][...] = 0.3 * rng.standard_normal(shape)
    run = root / f"run-{case}-{tok_kind}-{seed}"
    ck.save(run / ck.CKPT_NAME, cfg, tok, m.params, {"step": 7, "val_bpb": 3.5})
    return run, m, tok


def read_st(path):
    from safetensors.numpy import load_file
    return load_file(str(path))


def one_line_error(out):
    lines = [ln for ln in out.strip().splitlines() if ln.strip()]
    return len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in out


# ------------------------------------------------------------------------------ names and layouts
@pytest.mark.parametrize("case", [c for c in CASES if c != "mtp"])
def test_export_names_shapes_and_layouts(tmp_path, case):
    run, m, tok = make_run(tmp_path, case)
    cfg = m.cfg
    res = export_hf(run, tmp_path / "hf")
    out = tmp_path / "hf"
    assert sorted(p.name for p in out.iterdir()) == res.files == sorted(
        ["README.md", "config.json", "generation_config.json", "model.safetensors",
         "special_tokens_map.json", "tokenizer.json", "tokenizer_config.json"])
    t = read_st(out / "model.safetensors")
    C, F, V, H, K = cfg.d_model, cfg.d_ff, cfg.vocab_size, cfg.n_heads, cfg.n_kv_heads
    D = C // H
    want = {"model.embed_tokens.weight": (V, C), "model.norm.weight": (C,)}
    if not cfg.tie_embeddings:
        want["lm_head.weight"] = (V, C)
    for i in range(cfg.n_layers):
        p = f"model.layers.{i}."
        want.update({p + "input_layernorm.weight": (C,), p + "post_attention_layernorm.weight": (C,),
                     p + "self_attn.q_proj.weight": (H * D, C), p + "self_attn.k_proj.weight": (K * D, C),
                     p + "self_attn.v_proj.weight": (K * D, C), p + "self_attn.o_proj.weight": (C, H * D),
                     p + "mlp.gate_proj.weight": (F, C), p + "mlp.up_proj.weight": (F, C),
                     p + "mlp.down_proj.weight": (C, F)})
    assert {k: v.shape for k, v in t.items()} == want
    assert all(v.dtype == np.float32 for v in t.values())
    # layouts: nn.Linear stores (out, in), we store (in, out); the fused blocks split in order
    w = m.p["layers.1.wqkv"]
    assert np.array_equal(t["model.layers.1.self_attn.q_proj.weight"], w[:, :H * D].T)
    assert np.array_equal(t["model.layers.1.self_attn.k_proj.weight"], w[:, H * D:H * D + K * D].T)
    assert np.array_equal(t["model.layers.1.self_attn.v_proj.weight"], w[:, H * D + K * D:].T)
    assert np.array_equal(t["model.layers.1.mlp.gate_proj.weight"], m.p["layers.1.w_gateup"][:, :F].T)
    assert np.array_equal(t["model.layers.1.mlp.up_proj.weight"], m.p["layers.1.w_gateup"][:, F:].T)
    assert np.array_equal(t["model.layers.0.mlp.down_proj.weight"], m.p["layers.0.w_down"].T)
    assert np.array_equal(t["model.layers.0.self_attn.o_proj.weight"], m.p["layers.0.wo"].T)
    assert np.array_equal(t["model.layers.1.post_attention_layernorm.weight"], m.p["layers.1.mlp_norm"])
    assert np.array_equal(t["model.layers.0.input_layernorm.weight"], m.p["layers.0.attn_norm"])
    c = json.loads((out / "config.json").read_text())
    assert (c["rms_norm_eps"], c["rope_theta"], c["head_dim"]) == (2e-5, 500.0, D)
    assert c["rope_parameters"] == {"rope_type": "default", "rope_theta": 500.0}
    assert (c["hidden_size"], c["intermediate_size"], c["num_attention_heads"], c["num_key_value_heads"],
            c["num_hidden_layers"], c["vocab_size"], c["max_position_embeddings"]) == (C, F, H, K, 2, V, 64)
    assert c["tie_word_embeddings"] is cfg.tie_embeddings and c["architectures"] == ["LlamaForCausalLM"]
    assert c["bos_token_id"] == c["eos_token_id"] == tok.doc_id
    g = json.loads((out / "generation_config.json").read_text())
    assert g["eos_token_id"] == g["bos_token_id"] == tok.doc_id and g["top_k"] == 0
    # the tokenizer names every id by its bytes in the byte alphabet; <doc> right after the merges
    tj = json.loads((out / "tokenizer.json").read_text())
    vocab = tj["model"]["vocab"]
    assert len(vocab) == 256 + tok.n_merges
    assert all(vocab[token_string(tok.vocab[i])] == i for i in range(256 + tok.n_merges))
    assert tj["added_tokens"][0]["id"] == tok.doc_id and tj["added_tokens"][0]["content"] == "<doc>"
    assert (tok.n_merges > 0) == (case == "bpe")
    readme = (out / "README.md").read_text()
    assert f"id {tok.doc_id} is `<doc>`" in readme and "beyond the context" in readme.lower()


def test_byte_alphabet_by_hand():
    a = byte_alphabet()
    assert len(set(a)) == 256
    assert a[ord("A")] == "A" and a[ord("~")] == "~" and a[0xE9] == "é"   # printable: themselves
    assert a[0] == "Ā" and a[0x20] == "Ġ" and a[ord("\n")] == "Ċ"          # U+0100 + rank among the rest
    # 0x00-0x20 take ranks 0..32, DEL 33, 0x80-0xA0 34..66, the soft hyphen 0xAD the last, 67
    assert a[0x7F] == "\u0121" and a[0x80] == "\u0122" and a[0xAD] == "\u0143"


# ------------------------------------------------------------------------------ round trips
@pytest.mark.parametrize("case,tok_kind", [("plain", None), ("gqa", None), ("tied", None), ("bpe", "text"),
                                           ("bpe", "plain-bpe")])
def test_export_import_identical(tmp_path, case, tok_kind):
    run, m, tok = make_run(tmp_path, case, tok_kind)
    export_hf(run, tmp_path / "hf")
    res = import_hf(tmp_path / "hf", tmp_path / "back")
    assert res.note == ""
    a, b = ck.load(run), ck.load(tmp_path / "back")
    assert np.array_equal(a.params, b.params)                   # bit for bit, padding included
    assert a.cfg.to_dict() == b.cfg.to_dict()
    assert a.tokenizer.merges == b.tokenizer.merges and a.tokenizer.pre_split == b.tokenizer.pre_split
    assert b.m is None and b.train == {}                        # weights only: a start for fine-tuning
    # and the model computes the same thing
    lm = Model(b.cfg, numpy_ops)
    lm.load_flat(b.params)
    ids = np.random.default_rng(3).integers(0, b.cfg.vocab_size, (1, 20))
    assert np.array_equal(lm.forward_cached(ids, lm.new_cache(1, 20), 0),
                          m.forward_cached(ids, m.new_cache(1, 20), 0))


def test_cli_export_import_round_trip(tmp_path):
    run, m, tok = make_run(tmp_path, "gqa")
    r = runner.invoke(app, ["export", str(run), "--format", "hf", str(tmp_path / "hf")])
    assert r.exit_code == 0, r.output
    assert "model.safetensors" in r.output
    r = runner.invoke(app, ["import-hf", str(tmp_path / "hf"), "--out", str(tmp_path / "back")])
    assert r.exit_code == 0, r.output
    assert np.array_equal(ck.load(tmp_path / "back").params, ck.load(run).params)
    r = runner.invoke(app, ["info", str(tmp_path / "back")])
    assert r.exit_code == 0 and "heads 6/2" in r.output


def test_cli_output_dir_as_argument_or_option(tmp_path):
    """export and import-hf each take the directory to write as a second argument or as --out / -o
    (a user who writes `compress ... -o` writes `export RUN -o DIR` too); neither, or two that
    differ, is one error line."""
    run, m, tok = make_run(tmp_path, "plain")
    assert runner.invoke(app, ["export", str(run), "-o", str(tmp_path / "hf")]).exit_code == 0
    assert (tmp_path / "hf" / "model.safetensors").is_file()
    r = runner.invoke(app, ["import-hf", str(tmp_path / "hf"), str(tmp_path / "back")])
    assert r.exit_code == 0, r.output
    assert np.array_equal(ck.load(tmp_path / "back").params, ck.load(run).params)
    for args in (["export", str(run)], ["export", str(run), str(tmp_path / "a"), "-o", str(tmp_path / "b")],
                 ["import-hf", str(tmp_path / "hf")]):
        r = runner.invoke(app, args)
        assert r.exit_code == 2 and one_line_error(r.output), (args, r.output)
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


# ------------------------------------------------------------------------------ refusals, atomicity
def test_export_refuses_non_empty_dir_unless_forced(tmp_path):
    run, m, tok = make_run(tmp_path, "plain")
    out = tmp_path / "hf"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    r = runner.invoke(app, ["export", str(run), str(out)])
    assert r.exit_code == 2 and one_line_error(r.output) and "--force" in r.output
    assert (out / "keep.txt").read_text() == "mine"
    r = runner.invoke(app, ["export", str(run), str(out), "--force"])
    assert r.exit_code == 0, r.output
    assert not (out / "keep.txt").exists() and (out / "model.safetensors").is_file()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []   # no temp dirs left
    empty = tmp_path / "empty"
    empty.mkdir()
    assert runner.invoke(app, ["export", str(run), str(empty)]).exit_code == 0    # empty is fine


def test_export_refuses_its_own_run_dir_and_bad_input(tmp_path):
    run, m, tok = make_run(tmp_path, "plain")
    for args in (["export", str(run), str(run), "--force"],              # would delete the checkpoint
                 ["export", str(run), str(run.parent), "--force"],
                 ["export", str(run), str(tmp_path / "x"), "--format", "gguf"],
                 ["export", str(tmp_path / "nothing"), str(tmp_path / "x")]):
        r = runner.invoke(app, args)
        assert r.exit_code == 2 and one_line_error(r.output), (args, r.output)
    assert ck.load(run).params is not None
    assert not (tmp_path / "x").exists()


def test_failed_export_leaves_the_old_directory(tmp_path, monkeypatch):
    run, m, tok = make_run(tmp_path, "plain")
    out = tmp_path / "hf"
    export_hf(run, out)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    import bytemodel.hf.export as ex

    def boom(*a, **k):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(ex, "readme_text", lambda *a: "changed")
    monkeypatch.setattr(ex, "_fsync", boom)   # fails after model.safetensors is written
    with pytest.raises(OSError):
        export_hf(run, out, force=True)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([run.name, "hf"])


def test_mtp_heads_are_dropped_with_a_note(tmp_path):
    """A checkpoint with multi-token prediction heads exports its next-token model; the heads are
    named in a note and the README, and the trunk comes back unchanged."""
    run, m, tok = make_run(tmp_path, "mtp")
    heads = [n for n, _, _ in layout(m.cfg) if n.startswith("mtp.")]
    assert len(heads) == 8
    r = runner.invoke(app, ["export", str(run), str(tmp_path / "hf")])
    assert r.exit_code == 0, r.output
    assert "not exported" in r.output and all(h in r.output for h in heads)
    readme = (tmp_path / "hf" / "README.md").read_text()
    assert "2 multi-token prediction heads" in readme and "mtp.3.w_down" in readme
    assert not any(k.startswith("mtp") for k in read_st(tmp_path / "hf" / "model.safetensors"))
    import_hf(tmp_path / "hf", tmp_path / "back")
    back = ck.load(tmp_path / "back")
    assert back.cfg.mtp == 1
    bm = Model(back.cfg, numpy_ops)
    bm.load_flat(back.params)
    for name, _, _ in layout(back.cfg):
        assert np.array_equal(bm.p[name], m.p[name]), name


def test_import_refusals_are_one_line(tmp_path):
    run, m, tok = make_run(tmp_path, "plain")
    export_hf(run, tmp_path / "hf")
    src = tmp_path / "hf"

    def variant(name, edit=None, drop=(), tensors=None, tokenizer=None):
        d = tmp_path / name
        shutil.copytree(src, d)
        if edit:
            c = json.loads((d / "config.json").read_text())
            edit(c)
            (d / "config.json").write_text(json.dumps(c))
        for f in drop:
            (d / f).unlink()
        if tensors is not None:
            from safetensors.numpy import save_file
            save_file(tensors(read_st(d / "model.safetensors")), str(d / "model.safetensors"))
        if tokenizer is not None:
            tj = json.loads((d / "tokenizer.json").read_text())
            tokenizer(tj)
            (d / "tokenizer.json").write_text(json.dumps(tj))
        return d

    def drop_key(k):
        return lambda t: {n: v for n, v in t.items() if n != k}

    def swap_vocab(tj):
        v = tj["model"]["vocab"]
        a, b = byte_alphabet()[65], byte_alphabet()[66]
        v[a], v[b] = v[b], v[a]

    cases = {
        "bias": (variant("bias", lambda c: c.update(attention_bias=True)), "bias"),
        "headdim": (variant("hd", lambda c: c.update(head_dim=16)), "head_dim"),
        "scaling": (variant("sc", lambda c: c.update(rope_parameters={"rope_type": "yarn", "factor": 4.0})), "RoPE"),
        "act": (variant("act", lambda c: c.update(hidden_act="gelu")), "gelu"),
        "notllama": (variant("gpt", lambda c: c.update(model_type="gpt2", architectures=["GPT2LMHeadModel"])), "Llama"),
        "missing": (variant("miss", tensors=drop_key("model.norm.weight")), "model.norm.weight"),
        "shape": (variant("shape", lambda c: c.update(intermediate_size=50)), "shape"),
        "extra": (variant("extra", tensors=lambda t: {**t, "model.foo.weight": np.ones(3, np.float32)}), "model.foo"),
        "noweights": (variant("now", drop=["model.safetensors"]), "model.safetensors"),
        "vocab": (variant("voc", tokenizer=swap_vocab), "byte-level"),
        "nocfg": (variant("nocfg", drop=["config.json"]), "config.json"),
    }
    pick = variant("pickle", drop=["model.safetensors"])
    (pick / "pytorch_model.bin").write_bytes(b"\x80\x04not really")
    cases["pickle"] = (pick, "pickle")
    trunc = variant("trunc")
    data = (trunc / "model.safetensors").read_bytes()
    (trunc / "model.safetensors").write_bytes(data[:len(data) // 2])
    cases["truncated"] = (trunc, "truncated")
    for name, (d, word) in cases.items():
        r = runner.invoke(app, ["import-hf", str(d), "--out", str(tmp_path / f"out-{name}")])
        assert r.exit_code == 2 and one_line_error(r.output) and word in r.output, (name, r.output)
        assert not (tmp_path / f"out-{name}" / ck.CKPT_NAME).exists()
    # an existing checkpoint is not overwritten without --force
    r = runner.invoke(app, ["import-hf", str(src), "--out", str(run)])
    assert r.exit_code == 2 and one_line_error(r.output) and "--force" in r.output


def _bf16(x: np.ndarray) -> bytes:
    return (np.asarray(x, np.float32).view(np.uint32) >> 16).astype("<u2").tobytes()


def test_import_a_foreign_llama_bf16_sharded_without_tokenizer(tmp_path):
    """What other tools write: bf16 weights in two shards with an index, rope_theta at the top,
    no head_dim, an inv_freq buffer, no tokenizer.json -> plain bytes, converted exactly."""
    rng = np.random.default_rng(5)
    C, F, V = 16, 24, 260
    w = {"model.embed_tokens.weight": (V, C), "model.norm.weight": (C,), "lm_head.weight": (V, C),
         "model.layers.0.input_layernorm.weight": (C,), "model.layers.0.post_attention_layernorm.weight": (C,),
         "model.layers.0.self_attn.q_proj.weight": (C, C), "model.layers.0.self_attn.k_proj.weight": (C, C),
         "model.layers.0.self_attn.v_proj.weight": (C, C), "model.layers.0.self_attn.o_proj.weight": (C, C),
         "model.layers.0.mlp.gate_proj.weight": (F, C), "model.layers.0.mlp.up_proj.weight": (F, C),
         "model.layers.0.mlp.down_proj.weight": (C, F), "model.layers.0.self_attn.rotary_emb.inv_freq": (4,)}
    vals = {k: rng.standard_normal(s).astype(np.float32) for k, s in w.items()}
    vals = {k: (v.view(np.uint32) & 0xFFFF0000).view(np.float32) for k, v in vals.items()}  # bf16-exact
    d = tmp_path / "foreign"
    d.mkdir()
    names = sorted(vals)
    shards = {"model-00001-of-00002.safetensors": names[:6], "model-00002-of-00002.safetensors": names[6:]}
    for fname, keys in shards.items():
        header, off, blobs = {}, 0, []
        for k in keys:
            b = _bf16(vals[k])
            header[k] = {"dtype": "BF16", "shape": list(vals[k].shape), "data_offsets": [off, off + len(b)]}
            off += len(b)
            blobs.append(b)
        h = json.dumps(header).encode()
        (d / fname).write_bytes(len(h).to_bytes(8, "little") + h + b"".join(blobs))
    (d / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {k: f for f, ks in shards.items() for k in ks}}))
    (d / "config.json").write_text(json.dumps({
        "model_type": "llama", "hidden_size": C, "intermediate_size": F, "num_hidden_layers": 1,
        "num_attention_heads": 2, "vocab_size": V, "max_position_embeddings": 32, "rope_theta": 10000,
        "rms_norm_eps": 1e-6, "torch_dtype": "bfloat16"}))
    r = runner.invoke(app, ["import-hf", str(d), "--out", str(tmp_path / "run")])
    assert r.exit_code == 0, r.output
    assert "no tokenizer.json" in r.output
    ld = ck.load(tmp_path / "run")
    assert ld.cfg.vocab_size == 260 and ld.tokenizer.vocab_size == 257 and ld.cfg.norm_eps == 1e-6
    assert ld.cfg.n_kv_heads == 2 and not ld.cfg.tie_embeddings and ld.cfg.head_dim == 8
    m = Model(ld.cfg, numpy_ops)
    m.load_flat(ld.params)
    assert np.array_equal(m.p["lm_head"], vals["lm_head.weight"].T)
    assert np.array_equal(m.p["layers.0.wqkv"][:, 16:32], vals["model.layers.0.self_attn.k_proj.weight"].T)
    assert np.array_equal(m.p["layers.0.w_gateup"][:, 24:], vals["model.layers.0.mlp.up_proj.weight"].T)
    # exported again, the tokenizer's missing ids are suppressed in generation
    export_hf(tmp_path / "run", tmp_path / "again")
    g = json.loads((tmp_path / "again" / "generation_config.json").read_text())
    assert g["suppress_tokens"] == [257, 258, 259]


def test_config_reader_checks_types():
    with pytest.raises(ConfigError, match="hidden_size"):
        config_from_hf({"model_type": "llama", "hidden_size": "32"}, "c")
    base = {"model_type": "llama", "hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 4,
            "intermediate_size": 8, "vocab_size": 300}
    assert config_from_hf(base, "c").rope_theta == 10000.0 and config_from_hf(base, "c").norm_eps == 1e-6
    for bad, word in [({"rope_theta": "1e4"}, "rope_theta"), ({"rope_scaling": {"type": "linear"}}, "linear"),
                      ({"rope_scaling": [1]}, "rope_scaling"), ({"num_key_value_heads": 3}, "divisible"),
                      ({"vocab_size": 2.5}, "vocab_size"), ({"tie_word_embeddings": True, "rms_norm_eps": -1}, "positive")]:
        with pytest.raises(ConfigError, match=word):
            config_from_hf({**base, **bad}, "c")
    with pytest.raises(ConfigError, match="multiple"):
        config_from_hf({"model_type": "llama", "hidden_size": 30, "num_hidden_layers": 1,
                        "num_attention_heads": 4}, "c")


def test_tokenizer_json_reader_round_trip_and_refusals():
    from bytemodel.hf.tokenizer_json import tokenizer_json
    for kind in ("bytes", "text", "plain-bpe"):
        tok = make_tokenizer(kind)
        back = read_tokenizer_json(json.loads(json.dumps(tokenizer_json(tok))), "t")
        assert back.merges == tok.merges and back.pre_split == tok.pre_split
    d = tokenizer_json(make_tokenizer("text"))
    d["pre_tokenizer"]["pattern"]["Regex"] = r"\s+"
    with pytest.raises(TokenizerError, match="split"):
        read_tokenizer_json(d, "t")
    d = tokenizer_json(make_tokenizer("text"))
    d["model"]["merges"] = d["model"]["merges"][::-1]
    with pytest.raises(TokenizerError, match="merge 0"):
        read_tokenizer_json(d, "t")
    # two ids for the same bytes cannot be named apart in tokenizer.json: refused, not mangled
    dup = Tokenizer([(97, 98), (256, 99), (98, 99), (97, 258)])   # 'abc' twice
    with pytest.raises(TokenizerError, match="both stand for"):
        tokenizer_json(dup)


# ------------------------------------------------------------------------------ transformers itself
@pytest.fixture(scope="module")
def hf_libs():
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("tokenizers")
    torch.set_num_threads(1)
    return torch, transformers


def _hf_model(transformers, d):
    model = transformers.AutoModelForCausalLM.from_pretrained(str(d))
    return model.eval()


# fp32 on both sides; the sums run in different orders (BLAS blocking, softmax), which moves
# logits of size ~10 by ~1e-5 at these widths: 1e-4 absolute is 10x that, and a wrong mapping
# (a transposed or swapped block, the wrong eps or theta) moves them by 1e-2 or more.
ATOL = 1e-4


@pytest.mark.parametrize("case,tok_kind", [("plain", None), ("gqa", None), ("tied", None), ("bpe", "text"),
                                           ("bpe", "plain-bpe"), ("mtp", None)])
def test_transformers_logits_and_greedy_generation_match(tmp_path, hf_libs, case, tok_kind):
    torch, transformers = hf_libs
    run, m, tok = make_run(tmp_path, case, tok_kind)
    export_hf(run, tmp_path / "hf")
    hm = _hf_model(transformers, tmp_path / "hf")
    rng = np.random.default_rng(11)
    ids = rng.integers(0, m.cfg.vocab_size, (2, 64))          # random ids over the whole context
    with torch.no_grad():
        theirs = hm(torch.tensor(ids)).logits.numpy()
    ours = m.forward_cached(ids, m.new_cache(2, 64), 0)
    assert np.abs(ours).max() > 1.0                             # logits of a size where errors show
    np.testing.assert_allclose(theirs, ours, rtol=0, atol=ATOL)
    # greedy generation within the context: the same bytes
    from bytemodel.decode.generate import generate
    prompt = bytes(rng.integers(0, 256, 9, dtype=np.uint8))
    n_new = 40
    start = [tok.doc_id] + [int(i) for i in tok.encode(prompt)]
    with torch.no_grad():
        out = hm.generate(torch.tensor([start]), attention_mask=torch.ones(1, len(start), dtype=torch.long),
                          do_sample=False, max_new_tokens=n_new)
    new_ids = out[0, len(start):].tolist()
    assert len(start) + len(new_ids) <= m.cfg.context and len(new_ids) >= n_new // 2
    want = tok.decode(new_ids)      # transformers stops at <doc> (eos): so does ours when asked
    got = generate(m, tok, len(want) + 100, prompt, temperature=0.0, stop_at_doc_end=True) \
        if new_ids[-1] == tok.doc_id else generate(m, tok, len(want), prompt, temperature=0.0)
    assert got == want


def _bytes_block(readme: str, d) -> dict:
    block = re.search(r"```python bytes\n(.*?)```", readme, re.S).group(1)
    ns = {}
    exec(block.replace("THIS_DIR", str(d)), ns)
    return ns


@pytest.mark.parametrize("kind", ["bytes", "text", "plain-bpe"])
def test_auto_tokenizer_ids_are_ours_and_bytes_round_trip(tmp_path, hf_libs, kind):
    torch, transformers = hf_libs
    run, m, tok = make_run(tmp_path, "bpe", kind)
    d = tmp_path / "hf"
    export_hf(run, d)
    at = transformers.AutoTokenizer.from_pretrained(str(d))
    assert at.bos_token_id == at.eos_token_id == tok.doc_id
    rng = np.random.default_rng(2)
    texts = [sample_text(rng, 200), "", "a", "<doc> is bytes here", "  leading\n\n\ttabs  ", "x" * 300,
             "".join(chr(c) for c in rng.integers(1, 0x2FFF, 300)), "\u00a0\u2028 é\u0085 日本 🙂🙂"]
    for s in texts:
        want = [int(i) for i in tok.encode(s.encode("utf-8"))]
        assert at(s, add_special_tokens=False).input_ids == want, s[:40]
        assert at(s).input_ids == [tok.doc_id] + want
        assert at.decode(want) == s
    # arbitrary bytes, invalid UTF-8 included, through the README's recipe
    ns = _bytes_block((d / "README.md").read_text(), d)
    blobs = [bytes(range(256)), bytes(rng.integers(0, 256, 2000, dtype=np.uint8)), b"\xff\xfe\x80<doc>\xc3",
             sample_text(rng, 100).encode()[1:-1], bytes([0xC0, 0xC1, 0xF5, 0xFF]) * 20]
    for b in blobs:
        ids = ns["bytes_to_ids"](b)
        assert ids == [int(i) for i in tok.encode(b)]
        assert ns["ids_to_bytes"](ids) == b
        assert ns["ids_to_bytes"]([tok.doc_id] + ids + [tok.doc_id]) == b


def test_import_a_llama_that_transformers_saved(tmp_path, hf_libs):
    """A LlamaForCausalLM made and saved by transformers itself (tied, GQA) -> our logits equal its."""
    torch, transformers = hf_libs
    torch.manual_seed(0)
    conf = transformers.LlamaConfig(vocab_size=257, hidden_size=32, intermediate_size=40, num_hidden_layers=2,
                                    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=48,
                                    rms_norm_eps=3e-5, rope_theta=777.0, tie_word_embeddings=True,
                                    initializer_range=0.3)
    hm = transformers.LlamaForCausalLM(conf).eval()
    with torch.no_grad():
        for n, p in hm.named_parameters():
            if n.endswith("norm.weight"):
                p.add_(0.3 * torch.randn_like(p))
    hm.save_pretrained(str(tmp_path / "theirs"))
    r = runner.invoke(app, ["import-hf", str(tmp_path / "theirs"), "--out", str(tmp_path / "run")])
    assert r.exit_code == 0, r.output
    ld = ck.load(tmp_path / "run")
    assert ld.cfg.tie_embeddings and ld.cfg.n_kv_heads == 2 and ld.cfg.rope_theta == 777.0
    m = Model(ld.cfg, numpy_ops)
    m.load_flat(ld.params)
    ids = np.random.default_rng(4).integers(0, 257, (1, 48))
    with torch.no_grad():
        theirs = hm(torch.tensor(ids)).logits.numpy()
    ours = m.forward_cached(ids, m.new_cache(1, 48), 0)
    assert np.abs(ours).max() > 1.0
    np.testing.assert_allclose(theirs, ours, rtol=0, atol=ATOL)


def test_export_never_imports_torch(tmp_path):
    """The export is safetensors + JSON: it runs where torch is absent, and never loads it."""
    import subprocess
    import sys
    run, m, tok = make_run(tmp_path, "tied")
    code = ("import sys\nfrom typer.testing import CliRunner\nfrom bytemodel.cli import app\n"
            f"r = CliRunner().invoke(app, ['export', {str(run)!r}, {str(tmp_path / 'hf')!r}])\n"
            "assert r.exit_code == 0, r.output\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'transformers')))\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"
    assert (tmp_path / "hf" / "model.safetensors").is_file()


def test_export_takes_the_best_weights_unless_last(tmp_path):
    """A run directory holds best.safetensors beside the resume checkpoint: export, like generate
    and score, takes the best; --last the latest."""
    run, m, tok = make_run(tmp_path, "plain")
    best = m.params.copy()
    best[:] = best * 0.5
    ck.save(run / ck.BEST_NAME, m.cfg, tok, best, {"step": 3, "val_bpb": 2.0})
    export_hf(run, tmp_path / "hf-best")
    export_hf(run, tmp_path / "hf-last", last=True)
    emb = lambda d: read_st(d / "model.safetensors")["model.embed_tokens.weight"]
    np.testing.assert_array_equal(emb(tmp_path / "hf-best"), best[:m.p["wte"].size].reshape(m.p["wte"].shape))  # wte is first
    np.testing.assert_array_equal(emb(tmp_path / "hf-last"), m.p["wte"])
    r = CliRunner().invoke(app, ["export", str(run), str(tmp_path / "hf-cli"), "--last"])
    assert r.exit_code == 0, r.output
    np.testing.assert_array_equal(emb(tmp_path / "hf-cli"), m.p["wte"])
