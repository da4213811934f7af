"""LoRA: low-rank adapters on a frozen model (chapter 08; Hu et al., 2021, "LoRA: Low-Rank
Adaptation of Large Language Models").

Shapes: ``R`` the rank, ``D_in``/``D_out`` a layer's input and output widths, ``...`` any
leading dims (``B, S``). Fine-tuning changes a weight ``W`` by some ``dW``; LoRA bets that the
change has low rank and learns it as a product ``A B`` of two thin matrices, with ``W`` frozen::

                     +---------------------------+
         +---------> |  W   (D_in x D_out)       | --- x W ----------------+
         |           |  frozen                   |                         |
         |           +---------------------------+                         v
    x ---+                                                                (+) ---> h
    (..., D_in)      +--------------+   +---------------+                  ^     (..., D_out)
         +--drop---> | A (D_in x R) |-->| B (R x D_out) |-- x A B --* s ---+
                     | random init  |   | zeros at init |    s = alpha / R
                     +--------------+   +---------------+
                            trainable: R (D_in + D_out) numbers

    h = x W + s x A B          (the fourth deck's h = xW + xAB, with s = alpha / R)

``B = 0`` at the start, so an adapted model is exactly the model it wraps until it trains. After
training, :func:`merge_lora` folds ``s A B`` into ``W`` and inference costs nothing extra.

Layout. The deck writes ``x`` as a row vector ``(1 x D_in)``, so ``W`` is ``(D_in x D_out)``,
``A`` is ``(D_in x R)`` and ``B`` is ``(R x D_out)``: our ``A`` and ``B`` are stored exactly so.
``nn.Linear`` and peft store the transposes: ``weight`` is ``(D_out x D_in) = W^T``, peft's
``lora_A.weight`` is ``(R x D_in) = A^T`` and ``lora_B.weight`` is ``(D_out x R) = B^T``, and
the update is ``lora_B.weight @ lora_A.weight = (A B)^T``. The deck's other form, ``W + BA``,
fits the shapes only in that ``(out x in)`` convention.

:func:`apply_lora` swaps chosen ``nn.Linear`` modules of *any* model (a GPT, an Encoder, ...)
for :class:`LoRALinear`, by the HuggingFace names the course uses (``q_proj`` ... ``down_proj``),
so no second copy of a model class is needed (STYLE.md, trait 5). A test checks logits,
gradients and merged weights against peft.

Left out: LoRA on embeddings and convolutions, several adapters on one layer and switching
between them, quantised frozen weights (QLoRA), rsLoRA's ``alpha / sqrt(R)`` and DoRA, training
biases or extra whole modules (peft's ``bias``, ``modules_to_save``), and a Linear shared by two
parents (only the first path to it is adapted).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor, nn

__all__ = ["LoRAConfig", "LoRALinear", "apply_lora", "merge_lora", "unmerge_lora", "unwrap_lora",
           "lora_state_dict", "load_lora_state_dict", "trainable_parameters", "adamw_state_bytes",
           "TARGETS", "SHORTHANDS"]

TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "up_proj", "down_proj", "gate_proj")
SHORTHANDS = {"attn": ("q_proj", "k_proj", "v_proj", "o_proj"), "mlp": ("up_proj", "down_proj", "gate_proj")}


def _check_numbers(rank, alpha, dropout) -> None:
    """The checks LoRAConfig and LoRALinear share."""
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
        raise ValueError(f"rank must be an int >= 1, got {rank!r}")
    if not alpha > 0:
        raise ValueError(f"alpha must be > 0, got {alpha!r}")
    if not 0.0 <= dropout < 1.0:
        raise ValueError(f"dropout must be in [0, 1), got {dropout!r}")


@dataclass(frozen=True)
class LoRAConfig:
    """What :func:`apply_lora` adapts and how (chapter 08). The default layers are the paper's
    GPT-3 choice (queries and values); R = 8 is peft's default, alpha = 2 R a common choice
    (peft's default alpha is 8, a scaling of 1).

    >>> LoRAConfig(rank=4, targets=("attn",)).scaling, LoRAConfig(targets="mlp").names
    (4.0, ('up_proj', 'down_proj', 'gate_proj'))
    """

    rank: int = 8                                  # R, the width of the A -> B bottleneck
    alpha: float = 16.0                            # scaling = alpha / R: retuning R keeps the step size
    dropout: float = 0.0                           # on the low-rank path's input only, as peft
    targets: tuple[str, ...] = ("q_proj", "v_proj")  # nn.Linear names (TARGETS), or "attn" / "mlp"

    def __post_init__(self):
        _check_numbers(self.rank, self.alpha, self.dropout)
        targets = (self.targets,) if isinstance(self.targets, str) else tuple(self.targets)
        object.__setattr__(self, "targets", targets)  # a list or a lone string becomes a tuple
        if not targets:
            raise ValueError("targets must name at least one layer, got ()")
        unknown = [t for t in targets if t not in TARGETS and t not in SHORTHANDS]
        if unknown:
            raise ValueError(f"unknown targets {unknown}: expected names from {TARGETS} "
                             f"or the shorthands {tuple(SHORTHANDS)}")

    @property
    def scaling(self) -> float:
        """s = alpha / R, the factor on ``x A B``."""
        return self.alpha / self.rank

    @property
    def names(self) -> tuple[str, ...]:
        """The targets with the shorthands spelled out, in order, without repeats."""
        expanded = [n for t in self.targets for n in SHORTHANDS.get(t, (t,))]
        return tuple(dict.fromkeys(expanded))


class LoRALinear(nn.Module):
    """A frozen ``nn.Linear`` plus a trainable low-rank update: ``base(x) + s * drop(x) A B``
    (chapter 08).

    ``A`` ``(D_in, R)`` starts as peft's ``lora_A`` (Kaiming-uniform with ``a = sqrt(5)`` on an
    ``(R, D_in)`` weight: ``U(-1/sqrt(D_in), 1/sqrt(D_in))``, as ``nn.Linear``), ``B``
    ``(R, D_out)`` at zero, so the layer starts equal to ``base``. ``base``'s weight and bias are
    frozen. :meth:`merge` folds the update into ``base.weight``; a merged layer's forward is
    ``base(x)`` alone (and trains nothing: unmerge before training again).

    >>> base = nn.Linear(4, 3)
    >>> layer = LoRALinear(base, rank=2, alpha=4.0)
    >>> tuple(layer.A.shape), tuple(layer.B.shape), layer.scaling, layer.delta_weight().shape
    ((4, 2), (2, 3), 2.0, torch.Size([3, 4]))
    >>> x = torch.randn(5, 4)
    >>> torch.equal(layer(x), base(x))  # B = 0: exactly the base layer
    True
    """

    def __init__(self, base: nn.Linear, rank: int = 8, alpha: float = 16.0, dropout: float = 0.0):
        super().__init__()
        if not isinstance(base, nn.Linear):
            raise TypeError(f"LoRALinear wraps an nn.Linear, got {type(base).__name__}")
        _check_numbers(rank, alpha, dropout)
        d_in, d_out = base.in_features, base.out_features
        if rank > min(d_in, d_out):
            raise ValueError(f"rank={rank} > min(d_in, d_out) = min({d_in}, {d_out}): a rank above "
                             f"min(d_in, d_out) = {min(d_in, d_out)} adds parameters without adding "
                             f"expressiveness")
        self.base = base
        for p in base.parameters():
            p.requires_grad_(False)
        self.rank, self.alpha, self.scaling = rank, float(alpha), alpha / rank
        kw = {"device": base.weight.device, "dtype": base.weight.dtype}
        a = torch.empty(rank, d_in, **kw)  # peft's lora_A.weight layout, so its fan_in is D_in
        nn.init.kaiming_uniform_(a, a=math.sqrt(5))
        self.A = nn.Parameter(a.T.contiguous())  # (R, D_in) -> (D_in, R)
        self.B = nn.Parameter(torch.zeros(rank, d_out, **kw))  # (R, D_out)
        # peft skips the dropout module at p = 0; Identity also keeps train() and eval() equal
        self.dropout = nn.Dropout(dropout) if dropout > 0 else nn.Identity()
        self.merged = False

    @property
    def in_features(self) -> int:
        return self.base.in_features

    @property
    def out_features(self) -> int:
        return self.base.out_features

    def forward(self, x: Tensor) -> Tensor:
        out = self.base(x)  # (..., D_in) -> (..., D_out)
        if self.merged:  # s A B is inside base.weight already
            return out
        # adapters may be kept in fp32 beside a bf16 base: compute the update in the input's
        # dtype (under autocast the matmuls are cast anyway). (x A) B, never x (A B): the
        # R-wide middle costs R (D_in + D_out) per row instead of D_in D_out.
        h = self.dropout(x) @ self.A.to(x.dtype)  # (..., D_in) -> (..., R)
        return out + (h @ self.B.to(x.dtype)) * self.scaling  # (..., R) -> (..., D_out)

    def delta_weight(self) -> Tensor:
        """The update in ``nn.Linear``'s layout, ``s (A B)^T``: ``(D_out, D_in)``."""
        return (self.A @ self.B).T * self.scaling  # (D_in, R) @ (R, D_out) -> (D_out, D_in)

    @torch.no_grad()
    def merge(self) -> None:
        """``base.weight += s (A B)^T`` in place; forward then skips the low-rank path."""
        if self.merged:
            raise RuntimeError("this LoRALinear is already merged: merging again would add s A B "
                               "twice; call unmerge() first")
        self.base.weight += self.delta_weight().to(self.base.weight.dtype)
        self.merged = True

    @torch.no_grad()
    def unmerge(self) -> None:
        """``base.weight -= s (A B)^T``: undo :meth:`merge` (equal up to float rounding)."""
        if not self.merged:
            raise RuntimeError("this LoRALinear is not merged: there is nothing to unmerge")
        self.base.weight -= self.delta_weight().to(self.base.weight.dtype)
        self.merged = False

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, rank={self.rank}, "
                f"alpha={self.alpha}, merged={self.merged}")


def _lora_layers(model: nn.Module) -> list[tuple[str, LoRALinear]]:
    return [(name, m) for name, m in model.named_modules() if isinstance(m, LoRALinear)]


def _require_lora(model: nn.Module) -> list[tuple[str, LoRALinear]]:
    layers = _lora_layers(model)
    if not layers:
        raise ValueError("the model has no LoRALinear layers: call apply_lora(model, config) first")
    return layers


def _replace(model: nn.Module, name: str, new: nn.Module) -> None:
    parent, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent), child, new)  # get_submodule("") is the model itself


def apply_lora(model: nn.Module, config: LoRAConfig) -> list[str]:
    """Freeze ``model`` and wrap each ``nn.Linear`` named in ``config.targets`` in a
    :class:`LoRALinear`, in place; returns the adapted layers' qualified names, sorted
    (chapter 08).

    A target matches a module whose qualified name is the target or ends in ``"." + target``
    (``blocks.0.attn.q_proj``), as in peft. Every parameter of the model is frozen, so only the
    ``A`` and ``B`` matrices train; a tied ``lm_head`` is not a target and stays frozen with the
    embedding. Everything is checked before anything changes: a target that matches no
    ``nn.Linear``, a rank too large for some layer, or a model that already has adapters raises
    ``ValueError`` and leaves the model as it was.

    >>> from course_lib.model import GPT, ModelConfig
    >>> model = GPT(ModelConfig(vocab_size=16, d_model=16, n_layers=2, n_heads=2))
    >>> apply_lora(model, LoRAConfig(rank=2))
    ['blocks.0.attn.q_proj', 'blocks.0.attn.v_proj', 'blocks.1.attn.q_proj', 'blocks.1.attn.v_proj']
    >>> trainable_parameters(model)[0]  # 4 layers x R (D_in + D_out) = 4 x 2 x (16 + 16)
    256
    """
    if not isinstance(config, LoRAConfig):
        raise TypeError(f"config must be a LoRAConfig, got {type(config).__name__}")
    present = _lora_layers(model)
    if present:
        raise ValueError(f"the model already has LoRA layers ({', '.join(n for n, _ in present[:3])}, ...): "
                         f"apply_lora twice would wrap them again; call unwrap_lora(model) first")
    linears = {name: m for name, m in model.named_modules() if isinstance(m, nn.Linear)}
    chosen: set[str] = set()
    for target in config.targets:
        names = SHORTHANDS.get(target, (target,))  # "mlp" needs only some of its three (GELU has no gate)
        found = [n for n in linears if n.rpartition(".")[2] in names]
        if not found:
            available = sorted({n.rpartition(".")[2] for n in linears})
            raise ValueError(f"target {target!r} matches no nn.Linear in {type(model).__name__}; "
                             f"its Linear layers are named {available[:10]}")
        chosen.update(found)
    wrapped = {}
    for name in sorted(chosen):
        try:
            wrapped[name] = LoRALinear(linears[name], config.rank, config.alpha, config.dropout)
        except ValueError as e:  # say which layer was too narrow
            raise ValueError(f"{name}: {e}") from None
    for p in model.parameters():
        p.requires_grad_(False)
    for name, layer in wrapped.items():
        _replace(model, name, layer)
    return sorted(wrapped)


def merge_lora(model: nn.Module) -> list[str]:
    """:meth:`LoRALinear.merge` every adapted layer (all must be unmerged); returns their
    names, sorted.

    For inference at the base model's cost; :func:`unmerge_lora` to train on."""
    layers = _require_lora(model)
    already = [n for n, m in layers if m.merged]
    if already:
        raise RuntimeError(f"already merged: {already[:3]}; merging again would add s A B twice")
    for _, m in layers:
        m.merge()
    return sorted(n for n, _ in layers)


def unmerge_lora(model: nn.Module) -> list[str]:
    """:meth:`LoRALinear.unmerge` every adapted layer (all must be merged); returns their
    names, sorted."""
    layers = _require_lora(model)
    unmerged = [n for n, m in layers if not m.merged]
    if unmerged:
        raise RuntimeError(f"not merged: {unmerged[:3]}; there is nothing to unmerge")
    for _, m in layers:
        m.unmerge()
    return sorted(n for n, _ in layers)


def unwrap_lora(model: nn.Module) -> nn.Module:
    """Merge every adapter and put each layer's plain ``nn.Linear`` back; returns ``model``
    (changed in place), a plain model of its original class (peft's ``merge_and_unload``).

    The parameters stay frozen as :func:`apply_lora` left them (``requires_grad_(True)`` to
    train the whole model)."""
    for name, layer in _require_lora(model):
        if not name:
            raise ValueError("the model is itself a LoRALinear: use layer.merge() and layer.base")
        if not layer.merged:
            layer.merge()
        _replace(model, name, layer.base)
    return model


def lora_state_dict(model: nn.Module) -> dict[str, Tensor]:
    """Only the adapters: ``{"<layer>.A": (D_in, R), "<layer>.B": (R, D_out)}``, keyed by
    qualified parameter name (chapter 08).

    As ``state_dict()``, the tensors are detached and share storage with the model. ``alpha``
    and the targets are not in it: save ``dataclasses.asdict(config)`` beside it."""
    return {f"{name}.{p}": getattr(layer, p).detach() for name, layer in _require_lora(model)
            for p in ("A", "B")}


def load_lora_state_dict(model: nn.Module, state: dict[str, Tensor]) -> None:
    """Copy adapters from :func:`lora_state_dict` into ``model``, which :func:`apply_lora` must
    have adapted with the same rank and targets; missing or unexpected keys or a shape mismatch
    raise ``ValueError`` before anything is copied."""
    own = lora_state_dict(model)
    missing, unexpected = sorted(own.keys() - state.keys()), sorted(state.keys() - own.keys())
    if missing or unexpected:
        raise ValueError(f"adapter keys differ from the model's (other targets?): missing {missing[:4]}, "
                         f"unexpected {unexpected[:4]}")
    for key, tensor in state.items():
        if tensor.shape != own[key].shape:
            raise ValueError(f"{key}: shape {tuple(tensor.shape)} in the state, {tuple(own[key].shape)} in "
                             f"the model (A is (D_in, R), B is (R, D_out): another rank?)")
    merged = [n for n, m in _lora_layers(model) if m.merged]
    if merged:
        raise RuntimeError(f"{merged[:3]} are merged: unmerge_lora(model) before loading new adapters")
    with torch.no_grad():
        for key, tensor in state.items():
            model.get_parameter(key).copy_(tensor)  # copy_ casts to the model's dtype and device


def trainable_parameters(model: nn.Module) -> tuple[int, int]:
    """``(trainable, total)`` parameter counts, a tied matrix counted once.

    >>> trainable_parameters(LoRALinear(nn.Linear(16, 8), rank=2))  # 2 x (16 + 8); 16 x 8 + 8 + 48
    (48, 184)
    """
    params = list(model.parameters())  # parameters() yields a shared Parameter once
    return sum(p.numel() for p in params if p.requires_grad), sum(p.numel() for p in params)


def adamw_state_bytes(model: nn.Module) -> int:
    """Bytes of AdamW's two fp32 moments (``exp_avg``, ``exp_avg_sq``) for the trainable
    parameters only: 8 bytes each. Full fine-tuning pays 8 N for all N parameters
    (``flops.training_memory(config).optimizer``); LoRA pays 8 sum R (D_in + D_out).

    >>> adamw_state_bytes(LoRALinear(nn.Linear(16, 8), rank=2))  # 8 x 48
    384
    """
    return 8 * trainable_parameters(model)[0]
