"""Our parameters and config <-> Hugging Face LlamaForCausalLM names, layouts and config.json.

The architectures are the same (RMSNorm with gain, rotate-half RoPE, GQA, SwiGLU, no biases), so
the mapping is exact, only the layouts differ:

    ours (stored (in, out))                 HF LlamaForCausalLM (stored (out, in), as nn.Linear)
    wte (V, C)                              model.embed_tokens.weight (V, C)
    layers.i.attn_norm (C,)                 model.layers.i.input_layernorm.weight
    layers.i.wqkv (C, (H+2K)D)  columns     model.layers.i.self_attn.{q,k,v}_proj.weight
        [q heads | k heads | v heads]           (HD, C), (KD, C), (KD, C): the column blocks, transposed
    layers.i.wo (HD, C)                     model.layers.i.self_attn.o_proj.weight (C, HD)
    layers.i.mlp_norm (C,)                  model.layers.i.post_attention_layernorm.weight
    layers.i.w_gateup (C, 2F) [gate | up]   model.layers.i.mlp.{gate,up}_proj.weight (F, C) each
    layers.i.w_down (F, C)                  model.layers.i.mlp.down_proj.weight (C, F)
    norm_f (C,)                             model.norm.weight
    lm_head (C, V) (absent when tied)       lm_head.weight (V, C) (absent when tied)

Within a projection, head h owns columns h*D .. (h+1)*D - 1 on both sides, and both rotate the
two halves of a head (rotate-half RoPE), so no permutation is needed.
"""
from __future__ import annotations

import math

import numpy as np

from ..config import ModelConfig
from ..errors import CheckpointError, ConfigError
from ..model import buffer_size, layout, views


def trunk_names(cfg: ModelConfig) -> set[str]:
    """The names this mapping knows (the trunk); others (e.g. MTP heads) are not exported."""
    names = {"wte", "norm_f"} | ({"lm_head"} if not cfg.tie_embeddings else set())
    for i in range(cfg.n_layers):
        names |= {f"layers.{i}.{n}" for n in ("attn_norm", "wqkv", "wo", "mlp_norm", "w_gateup", "w_down")}
    return names


def extra_params(cfg: ModelConfig) -> list[str]:
    """Parameters in the layout that the HF model has no place for (dropped on export)."""
    known = trunk_names(cfg)
    return [name for name, _, _ in layout(cfg) if name not in known]


def to_hf(cfg: ModelConfig, params: np.ndarray) -> dict[str, np.ndarray]:
    """Flat parameters -> {HF name: contiguous float32 array}."""
    p = views(np.asarray(params, dtype=np.float32), cfg)
    H, K, D, F = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.d_ff
    c = np.ascontiguousarray
    out = {"model.embed_tokens.weight": c(p["wte"])}
    for i in range(cfg.n_layers):
        s, h = f"layers.{i}.", f"model.layers.{i}."
        qkv = p[s + "wqkv"]
        out.update({
            h + "input_layernorm.weight": c(p[s + "attn_norm"]),
            h + "self_attn.q_proj.weight": c(qkv[:, :H * D].T),
            h + "self_attn.k_proj.weight": c(qkv[:, H * D:(H + K) * D].T),
            h + "self_attn.v_proj.weight": c(qkv[:, (H + K) * D:].T),
            h + "self_attn.o_proj.weight": c(p[s + "wo"].T),
            h + "post_attention_layernorm.weight": c(p[s + "mlp_norm"]),
            h + "mlp.gate_proj.weight": c(p[s + "w_gateup"][:, :F].T),
            h + "mlp.up_proj.weight": c(p[s + "w_gateup"][:, F:].T),
            h + "mlp.down_proj.weight": c(p[s + "w_down"].T),
        })
    out["model.norm.weight"] = c(p["norm_f"])
    if not cfg.tie_embeddings:
        out["lm_head.weight"] = c(p["lm_head"].T)
    return out


def hf_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """{HF name: shape} that to_hf produces for this config."""
    C, F, V = cfg.d_model, cfg.d_ff, cfg.vocab_size
    H, K, D = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    out = {"model.embed_tokens.weight": (V, C)}
    for i in range(cfg.n_layers):
        h = f"model.layers.{i}."
        out.update({h + "input_layernorm.weight": (C,), h + "self_attn.q_proj.weight": (H * D, C),
                    h + "self_attn.k_proj.weight": (K * D, C), h + "self_attn.v_proj.weight": (K * D, C),
                    h + "self_attn.o_proj.weight": (C, H * D), h + "post_attention_layernorm.weight": (C,),
                    h + "mlp.gate_proj.weight": (F, C), h + "mlp.up_proj.weight": (F, C),
                    h + "mlp.down_proj.weight": (C, F)})
    out["model.norm.weight"] = (C,)
    if not cfg.tie_embeddings:
        out["lm_head.weight"] = (V, C)
    return out


# tensors some HF checkpoints carry that hold no weights (recomputed by the model)
_BUFFERS = ("rotary_emb.inv_freq",)


def _check_sizes(cfg: ModelConfig, tensors: dict[str, np.ndarray], where: str) -> None:
    """The config's layer count against the tensors the files really hold, before a name is made for
    each (num_hidden_layers 1e9 would make 9e9 names first). Past this the work is bounded by the
    tensors: every shape is compared before the flat buffer is allocated."""
    if cfg.n_layers > len(tensors):
        raise CheckpointError(f"{where}: config.json describes {cfg.n_layers:,} layers but the weight files "
                              f"hold only {len(tensors):,} tensors")


def from_hf(cfg: ModelConfig, tensors: dict[str, np.ndarray], where: str) -> np.ndarray:
    """{HF name: array} -> our flat float32 parameters. Missing, extra or misshapen tensors are errors."""
    _check_sizes(cfg, tensors, where)
    want = hf_shapes(cfg)
    for name, t in tensors.items():
        if name in want:
            if tuple(t.shape) != want[name]:
                raise CheckpointError(f"{where}: tensor {name} has shape {tuple(t.shape)}, "
                                      f"the config says {want[name]}")
        elif not (name.endswith(_BUFFERS) or (name == "lm_head.weight" and cfg.tie_embeddings)):
            raise CheckpointError(f"{where}: unexpected tensor {name} (not part of a plain Llama model)")
    missing = [n for n in want if n not in tensors]
    if missing:
        raise CheckpointError(f"{where}: tensor {missing[0]} is missing"
                              + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""))
    flat = np.zeros(buffer_size(cfg), dtype=np.float32)
    p = views(flat, cfg)
    g = lambda n: np.asarray(tensors[n], dtype=np.float32)  # noqa: E731
    F = cfg.d_ff
    p["wte"][...] = g("model.embed_tokens.weight")
    for i in range(cfg.n_layers):
        s, h = f"layers.{i}.", f"model.layers.{i}."
        p[s + "attn_norm"][...] = g(h + "input_layernorm.weight")
        p[s + "wqkv"][...] = np.concatenate([g(h + f"self_attn.{x}_proj.weight") for x in "qkv"], axis=0).T
        p[s + "wo"][...] = g(h + "self_attn.o_proj.weight").T
        p[s + "mlp_norm"][...] = g(h + "post_attention_layernorm.weight")
        p[s + "w_gateup"][:, :F] = g(h + "mlp.gate_proj.weight").T
        p[s + "w_gateup"][:, F:] = g(h + "mlp.up_proj.weight").T
        p[s + "w_down"][...] = g(h + "mlp.down_proj.weight").T
    p["norm_f"][...] = g("model.norm.weight")
    if not cfg.tie_embeddings:
        p["lm_head"][...] = g("lm_head.weight").T
    return flat


# ---------------------------------------------------------------------------------------- config
def hf_config(cfg: ModelConfig, doc_id: int) -> dict:
    """config.json for LlamaForCausalLM (read by transformers 4.x and 5.x)."""
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.d_model,
        "intermediate_size": cfg.d_ff,
        "num_hidden_layers": cfg.n_layers,
        "num_attention_heads": cfg.n_heads,
        "num_key_value_heads": cfg.n_kv_heads,
        "head_dim": cfg.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": cfg.context,
        "rms_norm_eps": cfg.norm_eps,          # ours is 1e-5; HF's default would be 1e-6
        "rope_theta": cfg.rope_theta,          # transformers 4.x reads this ...
        "rope_parameters": {"rope_type": "default", "rope_theta": cfg.rope_theta},  # ... 5.x this
        "rope_scaling": None,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "mlp_bias": False,
        "tie_word_embeddings": cfg.tie_embeddings,
        "initializer_range": cfg.init_std,
        "pretraining_tp": 1,
        "use_cache": True,
        "bos_token_id": doc_id,
        "eos_token_id": doc_id,
        "pad_token_id": doc_id,
        "dtype": "float32",
        "torch_dtype": "float32",
    }


def config_from_hf(d: dict, where: str) -> ModelConfig:
    """A Llama config.json -> ModelConfig; ConfigError (one line) for anything we cannot represent."""
    if not isinstance(d, dict):
        raise ConfigError(f"{where}: not a JSON object")
    mt, arch = d.get("model_type"), d.get("architectures") or []
    if mt != "llama" and "LlamaForCausalLM" not in arch:
        raise ConfigError(f"{where}: model_type is {mt!r}; only Llama models (LlamaForCausalLM) can be imported")

    def num(key, default=None, kind=int):
        v = d.get(key, default)
        if v is None or isinstance(v, bool) or not isinstance(v, (int, float)) \
                or (isinstance(v, float) and not math.isfinite(v)) or (kind is int and v != int(v)):
            raise ConfigError(f"{where}: {key} is {v!r}, expected {'an integer' if kind is int else 'a number'}")
        return kind(v)

    C, L, H = num("hidden_size"), num("num_hidden_layers"), num("num_attention_heads")
    K = num("num_key_value_heads", H)
    if H <= 0 or C % H:
        raise ConfigError(f"{where}: hidden_size {C} is not a multiple of num_attention_heads {H}")
    if d.get("head_dim") is not None and num("head_dim") != C // H:
        raise ConfigError(f"{where}: head_dim {d['head_dim']} differs from hidden_size / num_attention_heads "
                          f"= {C // H}; bytemodel needs them equal")
    act = d.get("hidden_act", "silu")
    if act != "silu":
        raise ConfigError(f"{where}: hidden_act {act!r}; bytemodel's MLP is SwiGLU (silu)")
    for key in ("attention_bias", "mlp_bias"):
        if d.get(key):
            raise ConfigError(f"{where}: {key} is set; bytemodel has no biases")
    rp, scaling = d.get("rope_parameters") or {}, d.get("rope_scaling") or {}
    for r in (rp, scaling):
        if not isinstance(r, dict):
            raise ConfigError(f"{where}: rope_parameters / rope_scaling is {r!r}, expected an object")
        kind = r.get("rope_type", r.get("type", "default"))
        if kind != "default":
            raise ConfigError(f"{where}: RoPE scaling {kind!r}; bytemodel has plain RoPE only")
    theta = rp.get("rope_theta", d.get("rope_theta", 10000.0))
    if isinstance(theta, bool) or not isinstance(theta, (int, float)):
        raise ConfigError(f"{where}: rope_theta is {theta!r}, expected a number")
    if d.get("pretraining_tp", 1) not in (1, None):
        raise ConfigError(f"{where}: pretraining_tp {d['pretraining_tp']}; only 1 is supported")
    try:
        return ModelConfig(vocab_size=num("vocab_size"), d_model=C, n_layers=L, n_heads=H, n_kv_heads=K,
                           d_ff=num("intermediate_size"), context=num("max_position_embeddings", 2048),
                           rope_theta=float(theta), norm_eps=num("rms_norm_eps", 1e-6, float),
                           tie_embeddings=bool(d.get("tie_word_embeddings", False)),
                           init_std=num("initializer_range", 0.02, float))
    except ConfigError as e:
        raise ConfigError(f"{where}: {e}") from None
