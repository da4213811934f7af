"""The decoder-only GPT: embedding, ``L`` blocks, final norm, LM head (chapter 03).

Shapes: ``B`` batch, ``S`` new positions, ``Sk`` keys so far (cached + new), ``D`` d_model,
``V`` vocabulary, ``L`` layers.

::

    idx (B, S) --tok_emb (+ pos_emb)--> (B, S, D) --L x Block (causal)--> norm_f --lm_head--> logits (B, S, V)

The same config gives GPT-2 (learned positions, LayerNorm, GELU, biases, tied head) and Llama
(RoPE, RMSNorm, SwiGLU, GQA, no biases, untied); :mod:`course_lib.model.hf` loads both from
HuggingFace. Positions come from :mod:`course_lib.positional`.

Batched prompts of different lengths are left-padded (:func:`course_lib.generation.left_pad`)
and come with a ``padding_mask``: pads get no attention and do not count as positions.

:func:`lm_loss` is the loss of every family: mean cross-entropy over the counted targets, in
fp32, with torch's fused ``F.cross_entropy`` (:func:`course_lib.functional.cross_entropy` is the
same formula written out; it agrees to rounding, not bit for bit), plus, in training mode, the
MoE layers' auxiliary losses (:func:`course_lib.moe.aux_loss`).

Left out: weight-init scaling of residual projections by ``1/sqrt(2L)``, and sliding-window
layers.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .. import attention
from ..moe import aux_loss
from ..positional import LearnedPositional, sinusoidal
from .blocks import Block, final_norm, make_rotary
from .config import ModelConfig

__all__ = ["GPT", "lm_loss", "check_ids"]


def lm_loss(model: nn.Module, logits: Tensor, targets: Tensor) -> Tensor:
    """Mean cross-entropy over target tokens (``-100`` = ignore), in fp32; in training mode plus
    the MoE layers' auxiliary losses, so that evaluation reports the language-model loss alone.
    ``logits`` ``(B, S, V)``, ``targets`` ``(B, S)``; ``model`` has a ``config``."""
    loss = F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(), ignore_index=-100)  # (B S, V)
    if model.training and model.config.moe is not None:
        loss = loss + aux_loss(model)
    return loss


def check_ids(name: str, idx, config: ModelConfig) -> None:
    """The checks on token ids of the other families (:mod:`course_lib.model.families`):
    ``(B, S)`` long, ``S <= context_length``, ids in ``0 .. V - 1``; ``name`` is the argument's
    name in the error. (:class:`GPT` checks its ids, caches and padding in ``_check``.)"""
    if not isinstance(idx, Tensor) or idx.dim() != 2 or idx.dtype != torch.long:
        got = f"shape {tuple(idx.shape)}, dtype {idx.dtype}" if isinstance(idx, Tensor) else type(idx)
        raise ValueError(f"{name} must be a (B, S) tensor of dtype torch.long, got {got}")
    if idx.shape[1] > config.context_length:
        raise ValueError(f"{name} has {idx.shape[1]} positions, more than context_length="
                         f"{config.context_length}")
    if idx.numel() and (int(idx.min()) < 0 or int(idx.max()) >= config.vocab_size):
        raise ValueError(f"{name}'s token ids must lie in 0 .. {config.vocab_size - 1} (vocab_size="
                         f"{config.vocab_size}), got min {int(idx.min())}, max {int(idx.max())}")


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
        self.rotary = make_rotary(c)
        if c.positional == "sinusoidal":  # fixed table; not saved, rebuilt from the config
            self.register_buffer("pos_table", sinusoidal(c.context_length, c.d_model), persistent=False)
        else:
            self.pos_table = None
        self.drop = nn.Dropout(c.dropout)
        self.blocks = nn.ModuleList(Block(c) for _ in range(c.n_layers))
        self.norm_f = final_norm(c)  # post-norm blocks already end in a norm: then Identity
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
        has_values = idx.numel() and idx.device.type != "meta"  # a meta tensor has a shape, no values
        if has_values and (int(idx.min()) < 0 or int(idx.max()) >= c.vocab_size):
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
            # causal without a mask: the fused kernel skips the masked half, and nothing waits for
            # the device to compare a mask (with earlier tokens cached, attention builds the mask)
            mask, is_causal = None, True
        else:
            positions, mask = self._padded_positions_and_mask(padding_mask, S)  # (B, S), (B, 1, S, Sk)
            is_causal = False
        x = self.tok_emb(idx)  # (B, S) -> (B, S, D)
        if self.pos_emb is not None:
            x = x + self.pos_emb(positions)  # (B, S, D) + (S, D) or (B, S, D)
        elif self.pos_table is not None:
            x = x + self.pos_table[positions].to(x.dtype)  # (B, S, D) + (S, D) or (B, S, D)
        x = self.drop(x)
        for i, block in enumerate(self.blocks):
            x = block(x, mask=mask, is_causal=is_causal, cache=None if caches is None else caches[i],
                      rotary=self.rotary, positions=positions)
        logits = self.lm_head(self.norm_f(x))  # (B, S, D) -> (B, S, V)
        loss = None
        if targets is not None:
            loss = lm_loss(self, logits, targets)
        return logits, loss
