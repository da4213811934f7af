"""The other two families of deck 2, from the same blocks: encoder-only and encoder-decoder (chapter 03).

Shapes: ``B`` batch, ``S`` positions (``Ss`` source, ``St`` target), ``D`` d_model, ``V`` vocabulary.

* :class:`MaskedLM` is encoder-only: an :class:`Encoder` (:class:`~course_lib.model.blocks.Block`-s
  with no causal mask) trained on hidden tokens chosen by :func:`mask_tokens`, as BERT;
* :class:`EncoderDecoder` adds a causal decoder of
  :class:`~course_lib.model.blocks.DecoderBlock`-s that cross-attend to the encoder's output,
  as the original transformer and T5.

Both share :class:`~course_lib.model.gpt.GPT`'s embedding recipe, initialisation, id checks
and loss (:func:`~course_lib.model.gpt.lm_loss`). Padding is given as a ``(B, S)`` bool mask,
True = real token, and goes on the right: positions count from each row's first token.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from .. import attention
from ..positional import LearnedPositional, sinusoidal
from .blocks import Block, DecoderBlock, final_norm, make_rotary
from .config import ModelConfig
from .gpt import GPT, check_ids, lm_loss

__all__ = ["Encoder", "MaskedLM", "mask_tokens", "EncoderDecoder"]


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
        self.rotary = make_rotary(c)
        self.blocks = nn.ModuleList(Block(c) for _ in range(c.n_layers))
        self.norm_f = final_norm(c)

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
        check_ids("idx", idx, self.config)
        return self.encoder(self.embed(idx), padding_mask=padding_mask)  # (B, S) -> (B, S, D)

    def forward(self, idx: Tensor, targets: Tensor | None = None, *,
                padding_mask: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
        check_ids("idx", idx, self.config)
        if targets is not None and (not isinstance(targets, Tensor) or targets.shape != idx.shape):
            got = tuple(targets.shape) if isinstance(targets, Tensor) else type(targets)
            raise ValueError(f"targets must have idx's shape {tuple(idx.shape)}, got {got}")
        h = self.encoder(self.embed(idx), padding_mask=padding_mask)  # (B, S) -> (B, S, D)
        logits = self.lm_head(h)  # (B, S, D) -> (B, S, V)
        loss = None
        if targets is not None:
            loss = lm_loss(self, logits, targets)
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
        self.rotary = make_rotary(c)
        self.decoder = nn.ModuleList(DecoderBlock(c) for _ in range(c.n_layers))
        self.norm_f = final_norm(c)
        self.lm_head = nn.Linear(c.d_model, c.vocab_size, bias=False)
        self.apply(GPT._init_weights)
        if c.tie_embeddings:
            self.lm_head.weight = self.embed.tok_emb.weight

    def encode(self, src: Tensor, src_padding_mask: Tensor | None = None) -> Tensor:
        """``(B, Ss)`` token ids -> memory ``(B, Ss, D)``."""
        check_ids("src", src, self.config)
        _key_padding_mask(src_padding_mask, *src.shape, "src_padding_mask")  # an error names it as here
        return self.encoder(self.embed(src), padding_mask=src_padding_mask)  # (B, Ss) -> (B, Ss, D)

    def decode(self, tgt_in: Tensor, memory: Tensor, src_padding_mask: Tensor | None = None) -> Tensor:
        """``(B, St)`` token ids and memory ``(B, Ss, D)`` -> logits ``(B, St, V)``."""
        c = self.config
        check_ids("tgt_in", tgt_in, c)
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
        check_ids("src", src, self.config)
        check_ids("tgt_in", tgt_in, self.config)
        if src.shape[0] != tgt_in.shape[0]:
            raise ValueError(f"src and tgt_in must have the same batch size B, got {src.shape[0]} and "
                             f"{tgt_in.shape[0]}")
        if targets is not None and (not isinstance(targets, Tensor) or targets.shape != tgt_in.shape):
            got = tuple(targets.shape) if isinstance(targets, Tensor) else type(targets)
            raise ValueError(f"targets must have tgt_in's shape {tuple(tgt_in.shape)}, got {got}")
        logits = self.decode(tgt_in, self.encode(src, src_padding_mask), src_padding_mask)  # (B, St, V)
        loss = None
        if targets is not None:
            loss = lm_loss(self, logits, targets)
        return logits, loss
