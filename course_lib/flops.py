"""Parameters, FLOPs, memory and model FLOP utilisation of a GPT (chapter 05).

Shapes and letters as everywhere in the course: ``D`` d_model, ``L`` layers, ``V`` vocabulary,
``F`` feed-forward width, ``H``/``Hkv`` heads, ``Dh`` head dim, ``S`` sequence length, ``B``
batch.

Three kinds of numbers, kept apart:

* **Exact** counts of a course_lib :class:`~course_lib.model.GPT` from its config alone
  (:func:`param_count`), equal to ``sum(p.numel())``, split by component.
* **The lectures' approximations**, which differ from each other and from the exact count:
  :func:`params_deck3` (``12 L D^2 + D V``: one, tied, embedding matrix; no biases, norms or
  positions), :func:`params_deck2` (the second deck's table: embedding *and* unembedding,
  ``4 D^2`` attention and ``8 D^2`` MLP per layer) and :func:`params_kaplan` (Kaplan et al.,
  2020: non-embedding ``2 D L (2 d_attn + F)``, ``12 L D^2`` when ``d_attn = D``, ``F = 4 D``).
* **FLOPs** as the second deck counts them (:func:`flops_per_token`): a matmul of an
  ``(n, d_in)`` input by a ``(d_in, d_out)`` weight costs ``2 n d_in d_out`` (a multiply and an
  add per weight per token); norms, biases, softmax and activations are left out as ``O(D)``.
  Training costs 3 times the forward pass (forward, gradient w.r.t. inputs, gradient w.r.t.
  weights), 4 times with activation checkpointing (the forward runs twice). Tests check the
  matmul count against ``torch.utils.flop_counter.FlopCounterMode`` on real passes.

Memory (:func:`training_memory`, :func:`model_kv_cache_bytes`) counts bytes of parameters,
gradients, AdamW's two moments, and the KV cache; activations are *measured*
(:func:`saved_activation_bytes`: the tensors autograd keeps for the backward pass), since a
formula for them depends on every implementation detail. :func:`matmul_flops_per_second` and
:func:`elementwise_flops_per_second` time the machine, and :func:`mfu` divides achieved by peak.

>>> from course_lib.model import ModelConfig
>>> param_count(ModelConfig(vocab_size=256, d_model=64, n_layers=2)).total
120576
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, replace

import torch
import torch.utils.checkpoint
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from .attention.cache import kv_cache_bytes
from .model import ModelConfig

__all__ = ["ParamCount", "param_count", "active_params", "params_deck2", "params_deck3", "params_kaplan",
           "PUBLISHED",
           "FlopCount", "flops_per_token", "training_flops", "MemoryCount", "training_memory",
           "model_kv_cache_bytes", "saved_activation_bytes", "checkpointed_blocks", "count_flops", "vgg16",
           "matmul_flops_per_second", "elementwise_flops_per_second", "mfu"]


@dataclass(frozen=True)
class ParamCount:
    """Parameters of a course_lib GPT by component; a tied head counts 0 (it *is* the embedding)."""

    embedding: int   # token embedding, V x D
    position: int    # learned position table, context_length x D (0 for sinusoidal, RoPE, none)
    attention: int   # q, k, v, o projections (and biases), all layers
    mlp: int         # up, gate, down projections (and biases), all layers; with MoE every expert + routers
    norms: int       # gains (and biases) of every norm, the final one included
    head: int        # lm_head, V x D when untied

    @property
    def total(self) -> int:
        return sum(asdict(self).values())

    @property
    def non_embedding(self) -> int:
        """Kaplan et al.'s N: everything but the token and position embeddings."""
        return self.total - self.embedding - self.position


def _one_mlp(config: ModelConfig) -> int:
    """Parameters of one MLP (one expert): its two (SwiGLU: three) matrices and their biases."""
    D, F, swiglu = config.d_model, config.ff_width, config.mlp == "swiglu"
    return (3 if swiglu else 2) * D * F + int(config.bias) * ((2 if swiglu else 1) * F + D)


def param_count(config: ModelConfig) -> ParamCount:
    """Exact parameter count of ``model.GPT(config)``, by component, from the config alone."""
    D, L, V = config.d_model, config.n_layers, config.vocab_size
    b = int(config.bias)
    kv = config.kv_heads * config.head_dim  # width of k and v: Hkv Dh

    def linear(d_in: int, d_out: int) -> int:
        return d_in * d_out + b * d_out

    attention = linear(D, D) + 2 * linear(D, kv) + linear(D, D)  # q, k, v, o
    mlp = _one_mlp(config)
    one_norm = D * (2 if config.norm == "layernorm" and config.bias else 1)
    n_norms = 2 * L + (1 if config.norm_position == "pre" else 0)  # pre-norm adds a final norm
    E = 1 if config.moe is None else config.moe.n_experts
    router = 0 if config.moe is None else D * E  # a D x E matrix, no bias
    return ParamCount(
        embedding=V * D,
        position=config.context_length * D if config.positional == "learned" else 0,
        attention=L * attention,
        mlp=L * (E * mlp + router),  # E experts (1 for a dense MLP) and the router, per layer
        norms=n_norms * one_norm,
        head=0 if config.tie_embeddings else V * D,
    )


def active_params(config: ModelConfig) -> int:
    """Parameters one token passes through (chapter 07): all of them for a dense model; with a
    mixture of experts, only the ``K`` chosen experts' share of the MLPs (routers included)."""
    total = param_count(config).total
    if config.moe is None:
        return total
    E, K = config.moe.n_experts, config.moe.top_k
    return total - config.n_layers * (E - K) * _one_mlp(config)  # the experts a token skips


def params_deck3(d_model: int, n_layers: int, vocab_size: int) -> int:
    """The third deck's ``12 L d^2 + d V``: 4 d^2 attention + 8 d^2 MLP per layer, one embedding."""
    return 12 * n_layers * d_model**2 + d_model * vocab_size


def params_deck2(d_model: int, n_layers: int, vocab_size: int) -> int:
    """The second deck's table: embedding and unembedding both counted, ``4 d^2 + 8 d^2`` per layer."""
    return 2 * vocab_size * d_model + n_layers * (4 * d_model**2 + 2 * d_model * 4 * d_model)


def params_kaplan(d_model: int, n_layers: int, d_attn: int | None = None, d_ff: int | None = None) -> int:
    """Kaplan et al. (2020): non-embedding ``N = 2 d L (2 d_attn + d_ff)`` (``12 L d^2`` by default)."""
    d_attn = d_model if d_attn is None else d_attn
    d_ff = 4 * d_model if d_ff is None else d_ff
    return 2 * d_model * n_layers * (2 * d_attn + d_ff)


_GPT2 = ModelConfig(vocab_size=50257, context_length=1024, d_model=768, n_layers=12, n_heads=12)
_GPT3 = replace(_GPT2, context_length=2048)
PUBLISHED: dict[str, ModelConfig] = {
    # Radford et al. (2019): 124M, 355M, 774M, 1.5B
    "gpt2": _GPT2,
    "gpt2-medium": replace(_GPT2, d_model=1024, n_layers=24, n_heads=16),
    "gpt2-large": replace(_GPT2, d_model=1280, n_layers=36, n_heads=20),
    "gpt2-xl": replace(_GPT2, d_model=1600, n_layers=48, n_heads=25),
    # Brown et al. (2020), Table 2.1. Its head counts for 1.3B (24) and 13B (40) do not divide
    # d_model; heads do not change the parameter count, so we use counts that do.
    "gpt3-small": replace(_GPT3, d_model=768, n_layers=12, n_heads=12),
    "gpt3-medium": replace(_GPT3, d_model=1024, n_layers=24, n_heads=16),
    "gpt3-large": replace(_GPT3, d_model=1536, n_layers=24, n_heads=16),
    "gpt3-xl": replace(_GPT3, d_model=2048, n_layers=24, n_heads=16),
    "gpt3-2.7b": replace(_GPT3, d_model=2560, n_layers=32, n_heads=32),
    "gpt3-6.7b": replace(_GPT3, d_model=4096, n_layers=32, n_heads=32),
    "gpt3-13b": replace(_GPT3, d_model=5140, n_layers=40, n_heads=20),
    "gpt3-175b": replace(_GPT3, d_model=12288, n_layers=96, n_heads=96),
    # Llama 3 8B: GQA with 8 kv heads, SwiGLU with F = 14336, RMSNorm, RoPE, untied, no biases
    "llama3-8b": ModelConfig(vocab_size=128256, context_length=8192, d_model=4096, n_layers=32, n_heads=32,
                             n_kv_heads=8, d_ff=14336, norm="rmsnorm", positional="rope", mlp="swiglu",
                             tie_embeddings=False, bias=False, rope_base=500000.0),
}


@dataclass(frozen=True)
class FlopCount:
    """Forward FLOPs *per token* by component, as the second deck's table (matmuls only)."""

    attention_proj: int   # q, k, v, o: 2 (2 D^2 + 2 D Hkv Dh) per layer
    attention_mix: int    # scores and weighted sum: 2 * 2 * S * D per layer (every key, as computed)
    mlp: int              # 2 * 2 * D * F per layer (2 * 3 * D * F for SwiGLU); MoE: K experts + router 2 D E
    head: int             # unembedding: 2 * D * V (the embedding is a lookup, no FLOPs)

    @property
    def total(self) -> int:
        return sum(asdict(self).values())


def flops_per_token(config: ModelConfig, seq_len: int | None = None) -> FlopCount:
    """Forward matmul FLOPs per token of ``model.GPT(config)`` on sequences of ``seq_len``.

    The attention mixing term counts every query-key pair the code computes (``S`` keys per
    query, the causal mask applied afterwards), as the deck does; a kernel that skips the
    masked half does about half of it.
    """
    S = config.context_length if seq_len is None else seq_len
    if S < 1:
        raise ValueError(f"seq_len must be >= 1, got {S}")
    D, L, V, F = config.d_model, config.n_layers, config.vocab_size, config.ff_width
    kv = config.kv_heads * config.head_dim
    K = 1 if config.moe is None else config.moe.top_k
    router = 0 if config.moe is None else 2 * D * config.moe.n_experts
    return FlopCount(
        attention_proj=L * 2 * (2 * D * D + 2 * D * kv),
        attention_mix=L * 2 * 2 * S * D,
        mlp=L * (K * 2 * (3 if config.mlp == "swiglu" else 2) * D * F + router),  # K experts + router
        head=2 * D * V,
    )


def count_flops(fn) -> int:
    """FLOPs that torch counts while ``fn()`` runs (``FlopCounterMode``: matmuls and convolutions).

    >>> count_flops(lambda: torch.ones(2, 3) @ torch.ones(3, 4))  # 2 * 2 * 3 * 4
    48
    """
    with FlopCounterMode(display=False) as counter:
        fn()
    return counter.get_total_flops()


def training_flops(config: ModelConfig, n_tokens: int, seq_len: int | None = None, *,
                   checkpointing: bool = False) -> int:
    """FLOPs to train on ``n_tokens``: 3 forward passes' worth (4 with activation checkpointing)."""
    return (4 if checkpointing else 3) * n_tokens * flops_per_token(config, seq_len).total


@dataclass(frozen=True)
class MemoryCount:
    """Bytes of a training step's persistent state (activations are measured separately)."""

    params: int
    grads: int
    optimizer: int   # AdamW's exp_avg and exp_avg_sq, same dtype as the parameters

    @property
    def total(self) -> int:
        return self.params + self.grads + self.optimizer


def training_memory(config: ModelConfig, bytes_per_param: int = 4) -> MemoryCount:
    """Parameters, gradients and AdamW state: ``4 * N * bytes`` in all (16 N bytes in fp32)."""
    n = param_count(config).total * bytes_per_param
    return MemoryCount(params=n, grads=n, optimizer=2 * n)


def model_kv_cache_bytes(config: ModelConfig, batch_size: int, seq_len: int, bytes_per_value: int = 4) -> int:
    """Keys and values of every layer of ``config``: ``2 * L * B * Hkv * S * Dh`` values."""
    return kv_cache_bytes(config.n_layers, config.kv_heads, config.head_dim, seq_len, batch_size,
                          bytes_per_value)


def saved_activation_bytes(model: nn.Module, *args, **kwargs) -> int:
    """Run ``model(*args, **kwargs)`` and return the bytes autograd saves for backward.

    Counted once per storage, and without the parameters themselves (which are saved for
    backward too but live in memory anyway). This is what activation checkpointing trades for
    a second forward pass.
    """
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor):
        storage = t.untyped_storage()
        if storage.data_ptr() not in params:
            seen[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(*args, **kwargs)
    return sum(seen.values())


def checkpointed_blocks(blocks, x: torch.Tensor, **block_kwargs) -> torch.Tensor:
    """Apply ``blocks`` in order with activation checkpointing: ``(B, S, D) -> (B, S, D)``.

    Autograd keeps only each block's input; the backward pass recomputes the block's forward
    (up to one more forward pass of the blocks; PyTorch stops recomputing once it has what the
    backward needs). One checkpoint per block, not one around the stack, so the recomputation
    needs one block's activations at a time. ``block_kwargs`` (mask, rotary, positions) go to
    every block.
    """
    for block in blocks:
        x = torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False, **block_kwargs)
    return x


def vgg16(num_classes: int = 1000) -> nn.Module:
    """VGG-16 (Simonyan & Zisserman, 2015; the first deck's 138,357,544 parameters) in plain torch.

    Build it under ``torch.device("meta")`` to count parameters without allocating 550 MB.
    """
    layers, channels = [], 3
    for width in (64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M"):
        if width == "M":
            layers.append(nn.MaxPool2d(2))
        else:
            layers += [nn.Conv2d(channels, width, kernel_size=3, padding=1), nn.ReLU()]
            channels = width
    return nn.Sequential(
        *layers, nn.Flatten(),  # (B, 512, 7, 7) -> (B, 25088) for a 224 x 224 image
        nn.Linear(512 * 7 * 7, 4096), nn.ReLU(),
        nn.Linear(4096, 4096), nn.ReLU(),
        nn.Linear(4096, num_classes),
    )


def _best_seconds(fn, device: torch.device, repeats: int) -> float:
    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    fn()  # warm-up
    sync()
    best = math.inf
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        sync()
        best = min(best, time.perf_counter() - start)
    return best


def matmul_flops_per_second(n: int = 1024, dtype: torch.dtype = torch.float32,
                            device: str | torch.device = "cpu", repeats: int = 5) -> float:
    """Achieved FLOP/s of an ``(n, n) @ (n, n)`` matmul (``2 n^3`` FLOPs), best of ``repeats``."""
    device = torch.device(device)
    a, b = (torch.randn(n, n, device=device).to(dtype) for _ in range(2))
    return 2 * n**3 / _best_seconds(lambda: a @ b, device, repeats)


def elementwise_flops_per_second(n: int = 1 << 24, dtype: torch.dtype = torch.float32,
                                 device: str | torch.device = "cpu", repeats: int = 5) -> float:
    """Achieved FLOP/s of ``a * b + c`` on ``n`` values (2 FLOPs each): memory-bound, far below a matmul."""
    device = torch.device(device)
    a, b, c = (torch.randn(n, device=device).to(dtype) for _ in range(3))
    return 2 * n / _best_seconds(lambda: torch.addcmul(c, a, b), device, repeats)


def mfu(achieved_flops_per_second: float, peak_flops_per_second: float) -> float:
    """Model FLOP utilisation: the fraction of the peak that a training step achieves."""
    if peak_flops_per_second <= 0 or achieved_flops_per_second < 0:
        raise ValueError("need a positive peak and a non-negative achieved rate")
    return achieved_flops_per_second / peak_flops_per_second
