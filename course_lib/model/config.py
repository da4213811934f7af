"""ModelConfig: every choice that fixes a model's shape, for the GPT and the other families (chapter 03).

One frozen dataclass; change it with ``dataclasses.replace``. Validation happens in
``__post_init__``, so a bad value fails when the config is made, with a message naming it,
not later inside torch. A checkpoint stores ``dataclasses.asdict(config)``; every field has a
default, so a checkpoint saved before a field existed still loads (it gets the default, which
is always the earlier behaviour).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from ..moe import MoEConfig
from ..positional import PAIRINGS

__all__ = ["ModelConfig", "CHOICES"]

# The string-valued fields and the values each accepts.
CHOICES = {
    "norm": ("layernorm", "rmsnorm"),
    "norm_position": ("pre", "post"),
    "positional": ("learned", "sinusoidal", "rope", "none"),
    "rope_pairing": PAIRINGS,
    "mlp": ("gelu", "gelu_exact", "swiglu"),
    "attn_impl": ("naive", "sdpa"),
}


@dataclass(frozen=True)
class ModelConfig:
    """Everything that fixes a GPT's shape (chapter 03). Change with ``dataclasses.replace``.

    >>> cfg = ModelConfig(mlp="swiglu")
    >>> cfg.head_dim, cfg.kv_heads, cfg.ff_width
    (16, 4, 176)
    """

    vocab_size: int = 256                # V; 256 = bytes, grows after BPE training
    context_length: int = 64             # longest sequence (positions 0 .. context_length - 1)
    d_model: int = 64                    # D, the residual stream's width
    n_layers: int = 2                    # L blocks
    n_heads: int = 4                     # H query heads, Dh = D // H
    n_kv_heads: int | None = None        # Hkv; None -> n_heads (MHA), 1 -> MQA, else GQA
    d_ff: int | None = None              # F; None -> 4 D (either gelu), 8 D / 3 rounded up to 8 (swiglu)
    dropout: float = 0.0                 # on embeddings, attention weights and both residual branches
    norm: Literal["layernorm", "rmsnorm"] = "layernorm"
    norm_position: Literal["pre", "post"] = "pre"
    positional: Literal["learned", "sinusoidal", "rope", "none"] = "learned"
    # The MLP's kind, activation included: "gelu" is GPT-2's tanh approximation (HF "gelu_new"),
    # "gelu_exact" the erf form (BERT, the original GPT; HF "gelu"), "swiglu" Llama's gated MLP.
    # One field rather than a GELU flag beside it: a flag would mean nothing for swiglu, and
    # "gelu" keeps the meaning it had in every saved config.
    mlp: Literal["gelu", "gelu_exact", "swiglu"] = "gelu"
    tie_embeddings: bool = True          # lm_head.weight is tok_emb.weight (GPT-2); False in Llama
    bias: bool = True                    # biases in every Linear and LayerNorm (GPT-2); False in Llama
    norm_eps: float | None = None        # every norm's; None -> 1e-5 LayerNorm (GPT-2), 1e-6 RMSNorm (Llama)
    rope_base: float = 10000.0           # RoPE's base (HF's rope_theta); used with positional="rope"
    # which dims RoPE turns together: (i, i + Dh/2) as HF Llama, or neighbours (2i, 2i + 1) as
    # RoFormer and Meta's Llama code; see course_lib.positional
    rope_pairing: Literal["halves", "interleaved"] = "halves"
    attn_impl: Literal["naive", "sdpa"] = "naive"  # readable softmax(QK^T)V, or torch's fused kernel
    moe: MoEConfig | None = None         # None = dense MLPs; else every MLP is a mixture of experts (ch. 07)

    def __post_init__(self):
        if isinstance(self.moe, dict):  # as dataclasses.asdict wrote it into a checkpoint
            object.__setattr__(self, "moe", MoEConfig(**self.moe))
        if self.moe is not None and not isinstance(self.moe, MoEConfig):
            raise TypeError(f"moe must be a MoEConfig or None, got {type(self.moe).__name__}")
        for name in ("vocab_size", "context_length", "d_model", "n_layers", "n_heads"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.n_kv_heads is not None and self.n_kv_heads < 1:
            raise ValueError(f"n_kv_heads must be >= 1 or None, got {self.n_kv_heads}")
        if self.d_ff is not None and self.d_ff < 1:
            raise ValueError(f"d_ff must be >= 1 or None, got {self.d_ff}")
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model={self.d_model} is not divisible by n_heads={self.n_heads}")
        if self.n_heads % self.kv_heads:
            raise ValueError(f"n_heads={self.n_heads} is not divisible by n_kv_heads={self.n_kv_heads}")
        for name, allowed in CHOICES.items():
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name} must be one of {allowed}, got {getattr(self, name)!r}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}")
        if self.norm_eps is not None and not self.norm_eps >= 0:
            raise ValueError(f"norm_eps must be >= 0 or None (the norm's default), got {self.norm_eps!r}")
        if not self.rope_base > 0:
            raise ValueError(f"rope_base must be > 0, got {self.rope_base!r}")
        if self.positional == "rope" and self.head_dim % 2:
            raise ValueError(f"rope needs an even head_dim, got d_model // n_heads = {self.head_dim}")
        if self.positional == "sinusoidal" and self.d_model % 2:
            raise ValueError(f"sinusoidal positions need an even d_model, got {self.d_model}")

    @property
    def head_dim(self) -> int:
        """Dh = D // H."""
        return self.d_model // self.n_heads

    @property
    def kv_heads(self) -> int:
        """Hkv, with None resolved to n_heads."""
        return self.n_heads if self.n_kv_heads is None else self.n_kv_heads

    @property
    def ff_width(self) -> int:
        """F: ``d_ff``, or 4 D for either GELU; for SwiGLU 2/3 of 4 D (three matrices instead of
        two, so the same parameter count), rounded up to a multiple of 8 as Llama rounds to 256."""
        if self.d_ff is not None:
            return self.d_ff
        return 8 * math.ceil(8 * self.d_model / 3 / 8) if self.mlp == "swiglu" else 4 * self.d_model
