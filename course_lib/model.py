"""The transformer block and a decoder-only GPT built from a :class:`ModelConfig` (chapter 03).

Shapes: ``B`` batch, ``S`` positions, ``D`` d_model, ``F`` feed-forward width, ``V`` vocabulary,
``L`` layers, ``H`` query heads, ``Hkv`` kv heads, ``Dh`` head dim.

A GPT is an embedding, ``L`` blocks that each *add* to a residual stream, a final norm and an
LM head. One block, in its two arrangements::

    pre-norm (GPT-2, Llama; default)         post-norm (Vaswani et al., 2017; BERT)

    x ----------+                            x ----------+
    |           |                            |           |
    norm        |                            attn        |
    attn        |                            |           |
    +  <--------+                            +  <--------+
    |                                        norm
    h ----------+                            h ----------+
    |           |                            |           |
    norm        |                            mlp         |
    mlp         |                            |           |
    +  <--------+                            +  <--------+
    |                                        norm
    out                                      out

    pre:  h = x + attn(norm(x));   out = h + mlp(norm(h))     (+ a final norm_f before the head)
    post: h = norm(x + attn(x));   out = norm(h + mlp(h))     (no final norm)

Pre-norm keeps an untouched path from the embedding to the head, which is why deep pre-norm
models train without warm-up tricks (Xiong et al., 2020). The same config gives GPT-2
(learned positions, LayerNorm, GELU, biases, tied head; :func:`from_hf_gpt2`) and Llama (RoPE,
RMSNorm, SwiGLU, GQA, no biases, untied; :func:`from_hf_llama`). Attention is
:class:`course_lib.attention.MultiHeadAttention`, positions come from
:mod:`course_lib.positional`, norms from :mod:`course_lib.norms`.

The same blocks make the other two families of deck 2: :class:`MaskedLM` is encoder-only
(no causal mask, trained on hidden tokens chosen by :func:`mask_tokens`, as BERT), and
:class:`EncoderDecoder` adds a causal decoder whose :class:`DecoderBlock` cross-attends to the
encoder's output (as the original transformer and T5).

Batched prompts of different lengths are left-padded (:func:`course_lib.generation.left_pad`)
and come with a ``padding_mask``: pads get no attention and do not count as positions.

With ``ModelConfig(moe=MoEConfig(...))`` every block's MLP is a mixture of experts
(:class:`course_lib.moe.MoE`, chapter 07) whose experts are this module's :class:`MLP`; in
training mode the loss then includes the experts' auxiliary losses.

Left out here: weight-init scaling of residual projections by
``1/sqrt(2L)``, and sliding-window layers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from . import attention
from .moe import MoE, MoEConfig, aux_loss
from .norms import make_norm
from .positional import LearnedPositional, RotaryEmbedding, sinusoidal

__all__ = ["ModelConfig", "MLP", "feed_forward", "Block", "GPT", "Encoder", "MaskedLM", "mask_tokens",
           "DecoderBlock", "EncoderDecoder", "from_hf_gpt2", "from_hf_llama"]


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
    d_ff: int | None = None              # F; None -> 4 D (gelu) or 8 D / 3 rounded up to 8 (swiglu)
    dropout: float = 0.0                 # on embeddings, attention weights and both residual branches
    norm: Literal["layernorm", "rmsnorm"] = "layernorm"
    norm_position: Literal["pre", "post"] = "pre"
    positional: Literal["learned", "sinusoidal", "rope", "none"] = "learned"
    mlp: Literal["gelu", "swiglu"] = "gelu"
    tie_embeddings: bool = True          # lm_head.weight is tok_emb.weight (GPT-2); False in Llama
    bias: bool = True                    # biases in every Linear and LayerNorm (GPT-2); False in Llama
    norm_eps: float | None = None        # None -> 1e-5 for LayerNorm (GPT-2), 1e-6 for RMSNorm (Llama)
    rope_base: float = 10000.0           # RoPE's base (HF's rope_theta); used with positional="rope"
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
        choices = {"norm": ("layernorm", "rmsnorm"), "norm_position": ("pre", "post"),
                   "positional": ("learned", "sinusoidal", "rope", "none"), "mlp": ("gelu", "swiglu"),
                   "attn_impl": ("naive", "sdpa")}
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name} must be one of {allowed}, got {getattr(self, name)!r}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}")
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
        """F: ``d_ff``, or 4 D for GELU; for SwiGLU 2/3 of 4 D (three matrices instead of two,
        so the same parameter count), rounded up to a multiple of 8 as Llama rounds to 256."""
        if self.d_ff is not None:
            return self.d_ff
        return 4 * self.d_model if self.mlp == "gelu" else 8 * math.ceil(8 * self.d_model / 3 / 8)


class MLP(nn.Module):
    """Position-wise feed-forward layer, ``(B, S, D) -> (B, S, D)`` (chapter 03).

    * ``gelu``: ``down_proj(gelu(up_proj(x)))``, D -> F -> D. GELU uses the tanh
      approximation (GPT-2's ``gelu_new``); it differs from the exact erf form by < 1e-3.
    * ``swiglu`` (Shazeer, 2020; Llama): ``down_proj(silu(gate_proj(x)) * up_proj(x))``.
    """

    def __init__(self, config: ModelConfig):
        super().__init__()
        D, F_, bias = config.d_model, config.ff_width, config.bias
        self.kind = config.mlp
        self.up_proj = nn.Linear(D, F_, bias=bias)
        self.gate_proj = nn.Linear(D, F_, bias=bias) if config.mlp == "swiglu" else None
        self.down_proj = nn.Linear(F_, D, bias=bias)

    def forward(self, x: Tensor) -> Tensor:
        if self.gate_proj is None:
            h = F.gelu(self.up_proj(x), approximate="tanh")  # (B, S, D) -> (B, S, F)
        else:
            h = F.silu(self.gate_proj(x)) * self.up_proj(x)  # (B, S, D) -> (B, S, F)
        return self.down_proj(h)  # (B, S, F) -> (B, S, D)


def feed_forward(config: ModelConfig) -> nn.Module:
    """A block's feed-forward layer: an :class:`MLP`, or with ``config.moe`` a mixture of
    ``E`` such MLPs behind a router (chapter 07)."""
    if config.moe is None:
        return MLP(config)
    return MoE(config.d_model, config.moe, make_expert=lambda: MLP(config))


def _loss(model: nn.Module, logits: Tensor, targets: Tensor) -> Tensor:
    """Mean cross-entropy over target tokens (``-100`` = ignore), in fp32; in training mode plus
    the MoE layers' auxiliary losses, so that evaluation reports the language-model loss alone."""
    loss = F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(), ignore_index=-100)
    if model.training and model.config.moe is not None:
        loss = loss + aux_loss(model)
    return loss


class Block(nn.Module):
    """Attention + MLP, each wrapped in a residual connection and a norm (chapter 03).

    Pre- or post-norm as drawn in the module docstring. ``forward(x, *, mask=None, cache=None,
    rotary=None, positions=None)`` with x ``(B, S, D)``; the keywords go to the attention layer.
    """

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.pre_norm = config.norm_position == "pre"
        self.attn = attention.MultiHeadAttention(config.d_model, config.n_heads, config.n_kv_heads,
                                                 bias=config.bias, dropout=config.dropout,
                                                 impl=config.attn_impl)
        self.attn_norm = make_norm(config.norm, config.d_model, eps=config.norm_eps, bias=config.bias)
        self.mlp = feed_forward(config)
        self.mlp_norm = make_norm(config.norm, config.d_model, eps=config.norm_eps, bias=config.bias)
        self.drop = nn.Dropout(config.dropout)

    def forward(self, x: Tensor, *, mask: Tensor | None = None, cache=None, rotary=None,
                positions: Tensor | None = None) -> Tensor:
        kw = dict(mask=mask, cache=cache, rotary=rotary, positions=positions)
        if self.pre_norm:
            x = x + self.drop(self.attn(self.attn_norm(x), **kw))
            return x + self.drop(self.mlp(self.mlp_norm(x)))
        x = self.attn_norm(x + self.drop(self.attn(x, **kw)))
        return self.mlp_norm(x + self.drop(self.mlp(x)))


class GPT(nn.Module):
    """Decoder-only language model (chapter 03).

    ``forward(idx (B, S) long, targets=None, *, caches=None, padding_mask=None) -> (logits (B, S, V),
    loss)``; ``loss`` is the cross-entropy averaged over target tokens (``-100`` = ignore), or None.
    Attention is always causal. With ``caches`` (one :class:`course_lib.attention.KVCache` per
    layer, from :meth:`make_caches`) ``idx`` holds only the *new* tokens, and their positions
    continue from the caches' length.

    ``padding_mask``: bool ``(B, Sk)``, True = real token, over *every* key so far (``Sk`` =
    cached + new; ``S`` without caches). A token's position is then the number of real tokens
    before it in its row, and no query attends to a pad, so a left-padded prompt gets the
    logits it would get alone; the logits at pad positions are garbage.

    >>> model = GPT(ModelConfig(vocab_size=10, context_length=8, d_model=16, n_heads=2))
    >>> logits, loss = model(torch.tensor([[1, 2, 3]]), torch.tensor([[2, 3, 4]]))
    >>> tuple(logits.shape), loss.shape
    ((1, 3, 10), torch.Size([]))
    """

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = c = config
        self.tok_emb = nn.Embedding(c.vocab_size, c.d_model)
        self.pos_emb = LearnedPositional(c.context_length, c.d_model) if c.positional == "learned" else None
        self.rotary = RotaryEmbedding(c.head_dim, c.rope_base) if c.positional == "rope" else None
        if c.positional == "sinusoidal":  # fixed table; not saved, rebuilt from the config
            self.register_buffer("pos_table", sinusoidal(c.context_length, c.d_model), persistent=False)
        else:
            self.pos_table = None
        self.drop = nn.Dropout(c.dropout)
        self.blocks = nn.ModuleList(Block(c) for _ in range(c.n_layers))
        # post-norm blocks already end in a norm, so only pre-norm needs a final one
        self.norm_f = (make_norm(c.norm, c.d_model, eps=c.norm_eps, bias=c.bias)
                       if c.norm_position == "pre" else nn.Identity())
        self.lm_head = nn.Linear(c.d_model, c.vocab_size, bias=False)
        self.apply(self._init_weights)
        if c.tie_embeddings:  # one (V, D) matrix reads tokens in and scores them out
            self.lm_head.weight = self.tok_emb.weight

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        """GPT-2's init: N(0, 0.02) for Linear and Embedding weights, zero biases."""
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def num_params(self, non_embedding: bool = False) -> int:
        """Parameters, a tied matrix counted once. ``non_embedding`` leaves out the token
        embedding and the learned position table (Kaplan et al.'s N); an untied lm_head stays."""
        n = sum(p.numel() for p in self.parameters())
        if non_embedding:
            n -= self.tok_emb.weight.numel()
            if self.pos_emb is not None:
                n -= self.pos_emb.embedding.weight.numel()
        return n

    def make_caches(self, batch_size: int, capacity: int | None = None, *, device=None,
                    dtype: torch.dtype | None = None) -> list[attention.KVCache]:
        """One empty KVCache per layer; capacity defaults to context_length, device and dtype
        to the model's."""
        c, p = self.config, self.tok_emb.weight
        capacity = c.context_length if capacity is None else capacity
        return [attention.KVCache(batch_size, c.kv_heads, c.head_dim, capacity,
                                  device=device or p.device, dtype=dtype or p.dtype)
                for _ in range(c.n_layers)]

    def _check(self, idx: Tensor, targets: Tensor | None, start: int,
               padding_mask: Tensor | None = None) -> None:
        c = self.config
        if not isinstance(idx, Tensor) or idx.dim() != 2 or idx.dtype != torch.long:
            got = f"shape {tuple(idx.shape)}, dtype {idx.dtype}" if isinstance(idx, Tensor) else type(idx)
            raise ValueError(f"idx must be a (B, S) tensor of dtype torch.long, got {got}")
        if start + idx.shape[1] > c.context_length:
            raise ValueError(f"sequence of {start + idx.shape[1]} positions ({start} cached + "
                             f"{idx.shape[1]} new) exceeds context_length={c.context_length}")
        if idx.numel() and (int(idx.min()) < 0 or int(idx.max()) >= c.vocab_size):
            raise ValueError(f"token ids must lie in 0 .. {c.vocab_size - 1} (vocab_size={c.vocab_size}), "
                             f"got min {int(idx.min())}, max {int(idx.max())}")
        if targets is not None and targets.shape != idx.shape:
            raise ValueError(f"targets must have idx's shape {tuple(idx.shape)}, got {tuple(targets.shape)}")
        if padding_mask is None:
            return
        B, Sk = idx.shape[0], start + idx.shape[1]
        if not (isinstance(padding_mask, Tensor) and padding_mask.dtype == torch.bool
                and tuple(padding_mask.shape) == (B, Sk)):
            got = (f"shape {tuple(padding_mask.shape)}, dtype {padding_mask.dtype}"
                   if isinstance(padding_mask, Tensor) else type(padding_mask))
            raise ValueError(f"padding_mask must be a bool (B, Sk) = ({B}, {Sk}) tensor over every key "
                             f"({start} cached + {idx.shape[1]} new), True = real token; got {got}")
        empty = (~padding_mask.any(-1)).nonzero().flatten().tolist()
        if empty:
            raise ValueError(f"padding_mask rows {empty} have no real token (all False)")

    @staticmethod
    def _padded_positions_and_mask(padding_mask: Tensor, S: int) -> tuple[Tensor, Tensor]:
        """Per-row positions ``(B, S)`` and attention mask ``(B, 1, S, Sk)`` of the last S of Sk keys::

            padding_mask   . . x x x        (. pad, x real; a left-padded prompt of 3)
            positions      0 0 0 1 2        real tokens before each one (pads clamped to 0)
        """
        Sk, device = padding_mask.shape[1], padding_mask.device
        positions = (padding_mask.cumsum(-1) - 1).clamp(min=0)[:, -S:]  # (B, Sk) -> (B, S)
        # A pad before the first real token has no real key to see: an all-masked row, 0/0 in
        # the softmax. scaled_dot_product_attention would zero such rows, at the price of a
        # check and a fix on every call; instead every query may see itself, so no row is empty.
        # A real query's own key is real, so it still never sees a pad; pads' outputs are unused.
        q_pos, k_pos = torch.arange(Sk - S, Sk, device=device), torch.arange(Sk, device=device)
        itself = q_pos[:, None] == k_pos  # (S, 1) == (Sk,) -> (S, Sk)
        keys = padding_mask[:, None, None, :] | itself  # (B, 1, 1, Sk) | (S, Sk) -> (B, 1, S, Sk)
        return positions, attention.causal_mask(S, Sk, device=device) & keys  # (B, 1, S, Sk)

    def forward(self, idx: Tensor, targets: Tensor | None = None, *,
                caches: list[attention.KVCache] | None = None,
                padding_mask: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
        if caches is not None and len(caches) != self.config.n_layers:
            raise ValueError(f"need one cache per layer ({self.config.n_layers}), got {len(caches)}")
        start = caches[0].length if caches else 0
        self._check(idx, targets, start, padding_mask)
        S = idx.shape[1]
        if padding_mask is None:
            positions = torch.arange(start, start + S, device=idx.device)  # (S,) absolute positions
            # with caches MultiHeadAttention builds causal_mask(S, Sk) itself
            mask = attention.causal_mask(S, device=idx.device) if caches is None else None  # (S, S)
        else:
            positions, mask = self._padded_positions_and_mask(padding_mask, S)  # (B, S), (B, 1, S, Sk)
        x = self.tok_emb(idx)  # (B, S) -> (B, S, D)
        if self.pos_emb is not None:
            x = x + self.pos_emb(positions)  # (B, S, D) + (S, D) or (B, S, D)
        elif self.pos_table is not None:
            x = x + self.pos_table[positions].to(x.dtype)  # (B, S, D) + (S, D) or (B, S, D)
        x = self.drop(x)
        for i, block in enumerate(self.blocks):
            x = block(x, mask=mask, cache=None if caches is None else caches[i], rotary=self.rotary,
                      positions=positions)
        logits = self.lm_head(self.norm_f(x))  # (B, S, D) -> (B, S, V)
        loss = None
        if targets is not None:
            loss = _loss(self, logits, targets)
        return logits, loss


# --------------------------------------------------------------------------- encoder-only, encoder-decoder
def _check_ids(name: str, idx, config: ModelConfig) -> None:
    """GPT's checks on token ids, for the models below: ``(B, S)`` long, ``S <= context_length``,
    ids in ``0 .. V - 1``."""
    if not isinstance(idx, Tensor) or idx.dim() != 2 or idx.dtype != torch.long:
        got = f"shape {tuple(idx.shape)}, dtype {idx.dtype}" if isinstance(idx, Tensor) else type(idx)
        raise ValueError(f"{name} must be a (B, S) tensor of dtype torch.long, got {got}")
    if idx.shape[1] > config.context_length:
        raise ValueError(f"{name} has {idx.shape[1]} positions, more than context_length="
                         f"{config.context_length}")
    if idx.numel() and (int(idx.min()) < 0 or int(idx.max()) >= config.vocab_size):
        raise ValueError(f"{name}'s token ids must lie in 0 .. {config.vocab_size - 1} (vocab_size="
                         f"{config.vocab_size}), got min {int(idx.min())}, max {int(idx.max())}")


def _key_padding_mask(padding_mask: Tensor | None, B: int, Sk: int, name: str) -> Tensor | None:
    """``(B, Sk)`` bool, True = real token -> the attention mask ``(B, 1, 1, Sk)``: every query
    (and every head) may attend to the real keys only."""
    if padding_mask is None:
        return None
    if (not isinstance(padding_mask, Tensor) or padding_mask.dtype != torch.bool
            or tuple(padding_mask.shape) != (B, Sk)):
        got = (f"shape {tuple(padding_mask.shape)}, dtype {padding_mask.dtype}"
               if isinstance(padding_mask, Tensor) else type(padding_mask))
        raise ValueError(f"{name} must be a (B, Sk) = ({B}, {Sk}) bool tensor (True = real token), got {got}")
    return padding_mask[:, None, None, :]  # (B, Sk) -> (B, 1, 1, Sk)


class _Embeddings(nn.Module):
    """Token embedding + absolute positions (learned or sinusoidal, per config) + dropout,
    ``(B, S) -> (B, S, D)``: GPT's first lines, for the models below. RoPE is not here: it
    turns q and k inside self-attention, so each stack holds its own ``rotary``."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        c = config
        self.tok_emb = nn.Embedding(c.vocab_size, c.d_model)
        self.pos_emb = LearnedPositional(c.context_length, c.d_model) if c.positional == "learned" else None
        if c.positional == "sinusoidal":  # fixed table; not saved, rebuilt from the config
            self.register_buffer("pos_table", sinusoidal(c.context_length, c.d_model), persistent=False)
        else:
            self.pos_table = None
        self.drop = nn.Dropout(c.dropout)

    def forward(self, idx: Tensor) -> Tensor:
        positions = torch.arange(idx.shape[1], device=idx.device)  # (S,) positions 0 .. S - 1
        x = self.tok_emb(idx)  # (B, S) -> (B, S, D)
        if self.pos_emb is not None:
            x = x + self.pos_emb(positions)  # (B, S, D) + (S, D)
        elif self.pos_table is not None:
            x = x + self.pos_table[positions].to(x.dtype)  # (B, S, D) + (S, D)
        return self.drop(x)


class Encoder(nn.Module):
    """``L`` :class:`Block`-s with a bidirectional mask, then a final norm (chapter 03).

    ``forward(x (B, S, D), *, padding_mask=None) -> (B, S, D)``, x already embedded.
    ``padding_mask`` ``(B, S)`` bool, True = real token, hides the padded keys from every
    query. The three families are the same blocks under different masks; rows are queries,
    columns keys, ``x`` = may attend, the last of S = 4 positions is padding::

        decoder-only (GPT)    encoder-only (BERT)    encoder-decoder (T5), decoder side
        causal                bidirectional + pad    self: causal     cross: source + pad
        x . . .               x x x .                x . . .          x x x .
        x x . .               x x x .                x x . .          x x x .
        x x x .               x x x .                x x x .          x x x .
        x x x x               x x x .                x x x x          x x x .

    A final norm only for pre-norm (post-norm blocks already end in one), as in :class:`GPT`.

    >>> enc = Encoder(ModelConfig(d_model=16, n_heads=2))
    >>> enc(torch.randn(2, 5, 16), padding_mask=torch.tensor([[True] * 5, [True] * 3 + [False] * 2])).shape
    torch.Size([2, 5, 16])
    """

    def __init__(self, config: ModelConfig):
        super().__init__()
        c = config
        self.rotary = RotaryEmbedding(c.head_dim, c.rope_base) if c.positional == "rope" else None
        self.blocks = nn.ModuleList(Block(c) for _ in range(c.n_layers))
        self.norm_f = (make_norm(c.norm, c.d_model, eps=c.norm_eps, bias=c.bias)
                       if c.norm_position == "pre" else nn.Identity())

    def forward(self, x: Tensor, *, padding_mask: Tensor | None = None) -> Tensor:
        if not isinstance(x, Tensor) or x.dim() != 3:
            raise ValueError(f"x must be an embedded (B, S, D) tensor, got "
                             f"{tuple(x.shape) if isinstance(x, Tensor) else type(x)}")
        mask = _key_padding_mask(padding_mask, x.shape[0], x.shape[1], "padding_mask")  # (B, 1, 1, S)
        for block in self.blocks:  # no causal mask: position i sees positions after i too
            x = block(x, mask=mask, rotary=self.rotary)
        return self.norm_f(x)


class MaskedLM(nn.Module):
    """Encoder-only model trained to fill in masked tokens: BERT (Devlin et al., 2019) (chapter 03).

    ``forward(idx (B, S) long, targets=None, *, padding_mask=None) -> (logits (B, S, V), loss)``.
    Embedding and positions as in :class:`GPT`, then an :class:`Encoder`: no causal mask, so
    the logits at position i use the tokens after i as well. It cannot generate left to right,
    but it can fill a gap from both sides. ``targets`` hold the original token where the input
    was corrupted and ``-100`` elsewhere (see :func:`mask_tokens`); ``loss`` is the
    cross-entropy over those positions only (NaN if there are none). ``padding_mask``
    ``(B, S)`` bool, True = real token: padded keys are hidden from every query; the logits at
    padded positions are computed but meaningless (give them target ``-100``). Pad on the
    right: positions count from the row's first token, so then the real tokens get the logits
    they would get alone (GPT's left padding renumbers them instead). ``encode(idx,
    padding_mask=None)`` returns the final hidden states ``(B, S, D)``, before the head.

    Left out from BERT: segment embeddings and next-sentence prediction, the [CLS] pooler, and
    the head's extra dense + GELU + norm before the (tied) output matrix.

    >>> model = MaskedLM(ModelConfig(vocab_size=10, context_length=8, d_model=16, n_heads=2))
    >>> logits, loss = model(torch.tensor([[5, 1, 7, 0]]), torch.tensor([[-100, 6, -100, -100]]),
    ...                      padding_mask=torch.tensor([[True, True, True, False]]))
    >>> tuple(logits.shape), loss.shape
    ((1, 4, 10), torch.Size([]))
    """

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = c = config
        self.embed = _Embeddings(c)
        self.encoder = Encoder(c)
        self.lm_head = nn.Linear(c.d_model, c.vocab_size, bias=False)
        self.apply(GPT._init_weights)
        if c.tie_embeddings:
            self.lm_head.weight = self.embed.tok_emb.weight

    def encode(self, idx: Tensor, padding_mask: Tensor | None = None) -> Tensor:
        _check_ids("idx", idx, self.config)
        return self.encoder(self.embed(idx), padding_mask=padding_mask)  # (B, S) -> (B, S, D)

    def forward(self, idx: Tensor, targets: Tensor | None = None, *,
                padding_mask: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
        _check_ids("idx", idx, self.config)
        if targets is not None and (not isinstance(targets, Tensor) or targets.shape != idx.shape):
            got = tuple(targets.shape) if isinstance(targets, Tensor) else type(targets)
            raise ValueError(f"targets must have idx's shape {tuple(idx.shape)}, got {got}")
        h = self.encoder(self.embed(idx), padding_mask=padding_mask)  # (B, S) -> (B, S, D)
        logits = self.lm_head(h)  # (B, S, D) -> (B, S, V)
        loss = None
        if targets is not None:
            loss = _loss(self, logits, targets)
        return logits, loss


def mask_tokens(ids: Tensor, mask_id: int, *, p: float = 0.15, vocab_size: int,
                generator: torch.Generator | None = None) -> tuple[Tensor, Tensor]:
    """BERT's corruption for masked-LM training (Devlin et al., 2019): ``(inputs, targets)``.

    Each position is chosen independently with probability ``p``. A chosen token becomes
    ``mask_id`` with probability 0.8, a token drawn uniformly from ``0 .. vocab_size - 1`` with
    0.1 (it may be the same token, or a special one, as in BERT's code), and stays as it is
    with 0.1, so the model cannot learn that only [MASK] positions matter. ``targets`` is the
    original id at chosen positions and ``-100`` (ignored by the loss) elsewhere. Exactly
    Bernoulli: a short row may get no chosen position, and a batch with none gives a NaN loss;
    padding is chosen like any token (give it target ``-100`` afterwards if it should not count).
    ``ids`` is ``(..., S)`` long; ``generator``, if given, lives on ``ids``' device.

    >>> g = torch.Generator().manual_seed(0)
    >>> ids = torch.randint(5, 100, (64, 128), generator=g)
    >>> inputs, targets = mask_tokens(ids, mask_id=4, vocab_size=100, generator=g)
    >>> chosen = targets != -100
    >>> round(chosen.float().mean().item(), 2), round((inputs[chosen] == 4).float().mean().item(), 1)
    (0.15, 0.8)
    >>> torch.equal(inputs[~chosen], ids[~chosen]), torch.equal(targets[chosen], ids[chosen])
    (True, True)
    """
    if not isinstance(ids, Tensor) or ids.dtype != torch.long:
        got = f"dtype {ids.dtype}" if isinstance(ids, Tensor) else type(ids)
        raise ValueError(f"ids must be a tensor of dtype torch.long, got {got}")
    if not 0.0 < p <= 1.0:
        raise ValueError(f"p must be in (0, 1], got {p}")
    if not 0 <= mask_id < vocab_size:
        raise ValueError(f"mask_id must lie in 0 .. {vocab_size - 1} (vocab_size={vocab_size}), "
                         f"got {mask_id}")
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= vocab_size):
        raise ValueError(f"ids must lie in 0 .. {vocab_size - 1} (vocab_size={vocab_size}), "
                         f"got min {int(ids.min())}, max {int(ids.max())}")
    chosen = torch.rand(ids.shape, generator=generator, device=ids.device) < p  # (..., S) bool
    u = torch.rand(ids.shape, generator=generator, device=ids.device)  # which of the three fates
    random_ids = torch.randint(0, vocab_size, ids.shape, generator=generator, device=ids.device)
    inputs = torch.where(chosen & (u < 0.8), mask_id, ids)  # 80 %: [MASK]
    inputs = torch.where(chosen & (u >= 0.8) & (u < 0.9), random_ids, inputs)  # 10 %: random; 10 %: kept
    targets = torch.where(chosen, ids, -100)
    return inputs, targets


class DecoderBlock(nn.Module):
    """Causal self-attention, cross-attention over the encoder's output, MLP (chapter 03).

    :class:`Block` with a second attention in the middle, whose keys and values come from
    ``memory`` ``(B, Sk, D)`` (the encoder's output) instead of ``x``. Each sublayer has its
    residual and norm, pre or post as in :class:`Block`::

        pre:  h = x + attn(norm(x));   c = h + cross(norm(h), memory);   out = c + mlp(norm(c))
        post: h = norm(x + attn(x));   c = norm(h + cross(h, memory));   out = norm(c + mlp(c))

    ``forward(x (B, S, D), memory (B, Sk, D), *, mask=None, cross_mask=None, rotary=None)``:
    ``mask`` is the self-attention's (pass ``causal_mask(S)``), ``cross_mask`` the
    cross-attention's (``(B, 1, 1, Sk)`` from the source padding), ``rotary`` goes to the
    self-attention only: queries and memory live on different position axes.

    >>> block = DecoderBlock(ModelConfig(d_model=16, n_heads=2))
    >>> block(torch.randn(2, 3, 16), torch.randn(2, 5, 16), mask=attention.causal_mask(3)).shape
    torch.Size([2, 3, 16])
    """

    def __init__(self, config: ModelConfig):
        super().__init__()
        c = config
        self.pre_norm = c.norm_position == "pre"
        self.attn = attention.MultiHeadAttention(c.d_model, c.n_heads, c.n_kv_heads, bias=c.bias,
                                                 dropout=c.dropout, impl=c.attn_impl)
        self.attn_norm = make_norm(c.norm, c.d_model, eps=c.norm_eps, bias=c.bias)
        self.cross_attn = attention.MultiHeadAttention(c.d_model, c.n_heads, c.n_kv_heads, bias=c.bias,
                                                       dropout=c.dropout, impl=c.attn_impl, kv_dim=c.d_model)
        self.cross_norm = make_norm(c.norm, c.d_model, eps=c.norm_eps, bias=c.bias)
        self.mlp = feed_forward(c)
        self.mlp_norm = make_norm(c.norm, c.d_model, eps=c.norm_eps, bias=c.bias)
        self.drop = nn.Dropout(c.dropout)

    def forward(self, x: Tensor, memory: Tensor, *, mask: Tensor | None = None,
                cross_mask: Tensor | None = None, rotary=None) -> Tensor:
        if self.pre_norm:
            x = x + self.drop(self.attn(self.attn_norm(x), mask=mask, rotary=rotary))
            x = x + self.drop(self.cross_attn(self.cross_norm(x), memory, mask=cross_mask))
            return x + self.drop(self.mlp(self.mlp_norm(x)))
        x = self.attn_norm(x + self.drop(self.attn(x, mask=mask, rotary=rotary)))
        x = self.cross_norm(x + self.drop(self.cross_attn(x, memory, mask=cross_mask)))
        return self.mlp_norm(x + self.drop(self.mlp(x)))


class EncoderDecoder(nn.Module):
    """Sequence-to-sequence transformer: T5 (Raffel et al., 2020), with the course's blocks (chapter 03).

    ::

        src (B, Ss) --embed--> Encoder (bidirectional) --------------------> memory (B, Ss, D)
                                                                                 | keys, values
        tgt_in (B, St) --embed--> L x DecoderBlock (causal self, cross, MLP) --> norm_f --> lm_head

    ``forward(src, tgt_in, targets=None, *, src_padding_mask=None) -> (logits (B, St, V), loss)``
    is ``decode(tgt_in, encode(src, src_padding_mask), src_padding_mask)``; generation encodes
    once and decodes step by step. ``src_padding_mask`` ``(B, Ss)`` bool, True = real token,
    hides padded source tokens from the encoder's self-attention and from the cross-attention.
    Teacher forcing: ``tgt_in`` is the target shifted right behind a start token, ``targets``
    the target (``-100`` = ignore). Right-padding of the target needs no mask: causality
    already hides it from the real positions; give it target ``-100``.

    One :class:`ModelConfig` for both stacks: each has ``n_layers`` layers (T5-small: 6 + 6),
    ``context_length`` bounds ``Ss`` and ``St`` separately, and positions follow
    ``config.positional`` (T5 itself uses relative position buckets). One token embedding (and
    position table) reads the source and the target and, with ``tie_embeddings``, scores the
    output, as in the original T5. Left out: a KV cache for the decoder (each step reruns the
    whole prefix, and the cross-attention's keys and values are recomputed from ``memory``),
    T5's relative position bias, its span-corruption objective and the ``D^-0.5`` scaling of
    the tied head.

    >>> model = EncoderDecoder(ModelConfig(vocab_size=10, context_length=8, d_model=16, n_heads=2))
    >>> src, tgt_in = torch.tensor([[3, 4, 5, 0]]), torch.tensor([[1, 5, 4]])
    >>> logits, loss = model(src, tgt_in, torch.tensor([[5, 4, 3]]),
    ...                      src_padding_mask=torch.tensor([[True, True, True, False]]))
    >>> tuple(logits.shape), tuple(model.encode(src).shape), loss.shape
    ((1, 3, 10), (1, 4, 16), torch.Size([]))
    """

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = c = config
        self.embed = _Embeddings(c)  # shared by source and target
        self.encoder = Encoder(c)
        self.rotary = RotaryEmbedding(c.head_dim, c.rope_base) if c.positional == "rope" else None
        self.decoder = nn.ModuleList(DecoderBlock(c) for _ in range(c.n_layers))
        self.norm_f = (make_norm(c.norm, c.d_model, eps=c.norm_eps, bias=c.bias)
                       if c.norm_position == "pre" else nn.Identity())
        self.lm_head = nn.Linear(c.d_model, c.vocab_size, bias=False)
        self.apply(GPT._init_weights)
        if c.tie_embeddings:
            self.lm_head.weight = self.embed.tok_emb.weight

    def encode(self, src: Tensor, src_padding_mask: Tensor | None = None) -> Tensor:
        """``(B, Ss)`` token ids -> memory ``(B, Ss, D)``."""
        _check_ids("src", src, self.config)
        _key_padding_mask(src_padding_mask, *src.shape, "src_padding_mask")  # an error names it as here
        return self.encoder(self.embed(src), padding_mask=src_padding_mask)  # (B, Ss) -> (B, Ss, D)

    def decode(self, tgt_in: Tensor, memory: Tensor, src_padding_mask: Tensor | None = None) -> Tensor:
        """``(B, St)`` token ids and memory ``(B, Ss, D)`` -> logits ``(B, St, V)``."""
        c = self.config
        _check_ids("tgt_in", tgt_in, c)
        B, St = tgt_in.shape
        if not (isinstance(memory, Tensor) and memory.dim() == 3 and memory.shape[0] == B
                and memory.shape[2] == c.d_model):
            got = tuple(memory.shape) if isinstance(memory, Tensor) else type(memory)
            raise ValueError(f"memory must be (B={B}, Ss, D={c.d_model}) as encode() returns, got {got}")
        cross_mask = _key_padding_mask(src_padding_mask, B, memory.shape[1], "src_padding_mask")  # (B,1,1,Ss)
        mask = attention.causal_mask(St, device=tgt_in.device)  # (St, St)
        x = self.embed(tgt_in)  # (B, St) -> (B, St, D)
        for block in self.decoder:
            x = block(x, memory, mask=mask, cross_mask=cross_mask, rotary=self.rotary)
        return self.lm_head(self.norm_f(x))  # (B, St, D) -> (B, St, V)

    def forward(self, src: Tensor, tgt_in: Tensor, targets: Tensor | None = None, *,
                src_padding_mask: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
        _check_ids("src", src, self.config)
        _check_ids("tgt_in", tgt_in, self.config)
        if src.shape[0] != tgt_in.shape[0]:
            raise ValueError(f"src and tgt_in must have the same batch size B, got {src.shape[0]} and "
                             f"{tgt_in.shape[0]}")
        if targets is not None and (not isinstance(targets, Tensor) or targets.shape != tgt_in.shape):
            got = tuple(targets.shape) if isinstance(targets, Tensor) else type(targets)
            raise ValueError(f"targets must have tgt_in's shape {tuple(tgt_in.shape)}, got {got}")
        logits = self.decode(tgt_in, self.encode(src, src_padding_mask), src_padding_mask)  # (B, St, V)
        loss = None
        if targets is not None:
            loss = _loss(self, logits, targets)
        return logits, loss


def _linear_from_conv1d(linear: nn.Linear, weight: Tensor, bias: Tensor) -> None:
    with torch.no_grad():  # GPT-2's Conv1D computes x @ W + b with W (in, out): transpose
        linear.weight.copy_(weight.t())
        linear.bias.copy_(bias)


def from_hf_gpt2(hf_model) -> GPT:
    """A :class:`GPT` holding the weights of a HuggingFace ``GPT2LMHeadModel`` (chapter 03).

    Mapping: ``wte -> tok_emb``, ``wpe -> pos_emb``, ``ln_1/ln_2 -> attn_norm/mlp_norm``,
    ``c_attn`` (q, k, v packed along the output dim) ``-> q_proj, k_proj, v_proj``,
    ``attn.c_proj -> o_proj``, ``c_fc -> up_proj``, ``mlp.c_proj -> down_proj``,
    ``ln_f -> norm_f``; the head is tied. Returned in eval mode.
    """
    hc = hf_model.config
    if hc.activation_function not in ("gelu_new", "gelu_pytorch_tanh"):
        raise ValueError(f"only GPT-2's tanh GELU is supported, got {hc.activation_function!r}")
    config = ModelConfig(vocab_size=hc.vocab_size, context_length=hc.n_positions, d_model=hc.n_embd,
                         n_layers=hc.n_layer, n_heads=hc.n_head, d_ff=hc.n_inner or 4 * hc.n_embd,
                         norm="layernorm", norm_position="pre", positional="learned", mlp="gelu",
                         tie_embeddings=True, bias=True, norm_eps=hc.layer_norm_epsilon)
    model, tr, D = GPT(config), hf_model.transformer, hc.n_embd
    with torch.no_grad():
        model.tok_emb.weight.copy_(tr.wte.weight)
        model.pos_emb.embedding.weight.copy_(tr.wpe.weight)
        for block, h in zip(model.blocks, tr.h, strict=True):
            w, b = h.attn.c_attn.weight, h.attn.c_attn.bias  # (D, 3D), (3D,)
            for j, proj in enumerate((block.attn.q_proj, block.attn.k_proj, block.attn.v_proj)):
                _linear_from_conv1d(proj, w[:, j * D:(j + 1) * D], b[j * D:(j + 1) * D])
            _linear_from_conv1d(block.attn.o_proj, h.attn.c_proj.weight, h.attn.c_proj.bias)
            _linear_from_conv1d(block.mlp.up_proj, h.mlp.c_fc.weight, h.mlp.c_fc.bias)
            _linear_from_conv1d(block.mlp.down_proj, h.mlp.c_proj.weight, h.mlp.c_proj.bias)
            for ours, theirs in ((block.attn_norm, h.ln_1), (block.mlp_norm, h.ln_2)):
                ours.weight.copy_(theirs.weight)
                ours.bias.copy_(theirs.bias)
        model.norm_f.weight.copy_(tr.ln_f.weight)
        model.norm_f.bias.copy_(tr.ln_f.bias)
    return model.eval()


def from_hf_llama(hf_model) -> GPT:
    """A :class:`GPT` holding the weights of a HuggingFace ``LlamaForCausalLM`` (chapter 03).

    RoPE (rotate-half, as :class:`course_lib.positional.RotaryEmbedding`), RMSNorm, SwiGLU,
    GQA, no biases; tied or not as the checkpoint says. Names already match except
    ``embed_tokens -> tok_emb``, ``input_layernorm -> attn_norm``,
    ``post_attention_layernorm -> mlp_norm``, ``model.norm -> norm_f``. RoPE scaling
    (Llama 3.1's frequency bands) is not supported. Returned in eval mode.
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
                         positional="rope", mlp="swiglu", tie_embeddings=hc.tie_word_embeddings,
                         bias=False, norm_eps=hc.rms_norm_eps, rope_base=float(theta))
    model, hm = GPT(config), hf_model.model
    with torch.no_grad():
        model.tok_emb.weight.copy_(hm.embed_tokens.weight)
        for block, h in zip(model.blocks, hm.layers, strict=True):
            for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
                getattr(block.attn, name).weight.copy_(getattr(h.self_attn, name).weight)
            for name in ("gate_proj", "up_proj", "down_proj"):
                getattr(block.mlp, name).weight.copy_(getattr(h.mlp, name).weight)
            block.attn_norm.weight.copy_(h.input_layernorm.weight)
            block.mlp_norm.weight.copy_(h.post_attention_layernorm.weight)
        model.norm_f.weight.copy_(hm.norm.weight)
        if not config.tie_embeddings:
            model.lm_head.weight.copy_(hf_model.lm_head.weight)
    return model.eval()
