"""HuggingFace checkpoints as course GPTs: GPT-2 and Llama (chapter 03).

Each function reads a HuggingFace model's config into a :class:`ModelConfig`, renames its
weights to ours, and loads them with :func:`~course_lib.model.loading.load_weights`, which
checks every name and shape. The two differ in how they store a linear layer's matrix:
GPT-2's ``Conv1D`` computes ``x @ W`` with ``W`` ``(d_in, d_out)`` (``layout="in_out"``), Llama
uses ``nn.Linear``, ``(d_out, d_in)``, as we do (``layout="out_in"``).

Only the transformers objects passed in are used; this module does not import transformers.
"""

from __future__ import annotations

from torch import Tensor

from .config import ModelConfig
from .gpt import GPT
from .loading import load_weights

__all__ = ["GPT2_ACTIVATIONS", "from_hf_gpt2", "from_hf_llama"]

# GPT-2 configs name their activation; HF's "gelu" is the exact erf form, the others tanh.
GPT2_ACTIVATIONS = {"gelu_new": "gelu", "gelu_pytorch_tanh": "gelu", "gelu": "gelu_exact"}


def from_hf_gpt2(hf_model) -> GPT:
    """A :class:`GPT` holding the weights of a HuggingFace ``GPT2LMHeadModel`` (chapter 03).

    Mapping: ``wte -> tok_emb``, ``wpe -> pos_emb``, ``ln_1/ln_2 -> attn_norm/mlp_norm``,
    ``c_attn`` (q, k, v packed along the output dim) ``-> q_proj, k_proj, v_proj``,
    ``attn.c_proj -> o_proj``, ``c_fc -> up_proj``, ``mlp.c_proj -> down_proj``,
    ``ln_f -> norm_f``; the head is tied. GPT-2's own ``activation_function`` (``gelu_new``)
    and ``gelu_pytorch_tanh`` give ``mlp="gelu"`` (tanh), ``gelu`` gives ``mlp="gelu_exact"``;
    anything else is a ValueError. Returned in eval mode.
    """
    hc = hf_model.config
    if hc.activation_function not in GPT2_ACTIVATIONS:
        raise ValueError(f"activation_function must be one of {tuple(GPT2_ACTIVATIONS)} (GELU, tanh or "
                         f"exact), got {hc.activation_function!r}")
    D = hc.n_embd
    config = ModelConfig(vocab_size=hc.vocab_size, context_length=hc.n_positions, d_model=D,
                         n_layers=hc.n_layer, n_heads=hc.n_head, d_ff=hc.n_inner or 4 * D,
                         norm="layernorm", norm_position="pre", positional="learned",
                         mlp=GPT2_ACTIVATIONS[hc.activation_function], tie_embeddings=True, bias=True,
                         norm_eps=hc.layer_norm_epsilon)
    tr = hf_model.transformer
    weights: dict[str, Tensor] = {"tok_emb.weight": tr.wte.weight, "pos_emb.embedding.weight": tr.wpe.weight,
                                  "norm_f.weight": tr.ln_f.weight, "norm_f.bias": tr.ln_f.bias}
    for i, h in enumerate(tr.h):
        ours = f"blocks.{i}."
        qkv_w = h.attn.c_attn.weight.split(D, dim=1)  # (D, 3D) -> 3 x (D, D), still (d_in, d_out)
        qkv_b = h.attn.c_attn.bias.split(D)  # (3D,) -> 3 x (D,)
        for name, w, b in zip(("q_proj", "k_proj", "v_proj"), qkv_w, qkv_b, strict=True):
            weights[ours + f"attn.{name}.weight"], weights[ours + f"attn.{name}.bias"] = w, b
        for name, conv in (("attn.o_proj", h.attn.c_proj), ("mlp.up_proj", h.mlp.c_fc),
                           ("mlp.down_proj", h.mlp.c_proj)):
            weights[ours + f"{name}.weight"], weights[ours + f"{name}.bias"] = conv.weight, conv.bias
        for name, norm in (("attn_norm", h.ln_1), ("mlp_norm", h.ln_2)):
            weights[ours + f"{name}.weight"], weights[ours + f"{name}.bias"] = norm.weight, norm.bias
    return load_weights(GPT(config), weights, layout="in_out").eval()  # the tied lm_head is tok_emb


def from_hf_llama(hf_model) -> GPT:
    """A :class:`GPT` holding the weights of a HuggingFace ``LlamaForCausalLM`` (chapter 03).

    RoPE (rotate-half: ``rope_pairing="halves"``, as :class:`course_lib.positional.RotaryEmbedding`
    by default), RMSNorm, SwiGLU, GQA, no biases; tied or not as the checkpoint says. Names
    already match except ``embed_tokens -> tok_emb``, ``input_layernorm -> attn_norm``,
    ``post_attention_layernorm -> mlp_norm``, ``model.norm -> norm_f``. RoPE scaling (Llama
    3.1's frequency bands) is not supported. Returned in eval mode.
    """
    hc = hf_model.config
    rope = getattr(hc, "rope_parameters", None) or getattr(hc, "rope_scaling", None) or {}
    if rope.get("rope_type", rope.get("type", "default")) != "default":
        raise ValueError(f"RoPE scaling is not supported, got {rope}")
    theta = getattr(hc, "rope_theta", None) or rope.get("rope_theta", 10000.0)
    if getattr(hc, "attention_bias", False) or getattr(hc, "mlp_bias", False) or hc.hidden_act != "silu":
        raise ValueError("expected Llama's bias-free attention and MLP with SiLU gating")
    head_dim = getattr(hc, "head_dim", None) or hc.hidden_size // hc.num_attention_heads
    if head_dim * hc.num_attention_heads != hc.hidden_size:
        raise ValueError(f"head_dim={head_dim} x heads != hidden_size={hc.hidden_size} is not supported")
    config = ModelConfig(vocab_size=hc.vocab_size, context_length=hc.max_position_embeddings,
                         d_model=hc.hidden_size, n_layers=hc.num_hidden_layers,
                         n_heads=hc.num_attention_heads, n_kv_heads=hc.num_key_value_heads,
                         d_ff=hc.intermediate_size, norm="rmsnorm", norm_position="pre",
                         positional="rope", rope_pairing="halves", mlp="swiglu",
                         tie_embeddings=hc.tie_word_embeddings, bias=False, norm_eps=hc.rms_norm_eps,
                         rope_base=float(theta))
    hm = hf_model.model
    weights: dict[str, Tensor] = {"tok_emb.weight": hm.embed_tokens.weight, "norm_f.weight": hm.norm.weight}
    for i, h in enumerate(hm.layers):
        ours = f"blocks.{i}."
        for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
            weights[ours + f"attn.{name}.weight"] = getattr(h.self_attn, name).weight
        for name in ("gate_proj", "up_proj", "down_proj"):
            weights[ours + f"mlp.{name}.weight"] = getattr(h.mlp, name).weight
        weights[ours + "attn_norm.weight"] = h.input_layernorm.weight
        weights[ours + "mlp_norm.weight"] = h.post_attention_layernorm.weight
    if not config.tie_embeddings:
        weights["lm_head.weight"] = hf_model.lm_head.weight
    return load_weights(GPT(config), weights, layout="out_in").eval()
