"""Loading a flat dict of weights into a model, whichever way round its matrices are stored (chapter 03).

A linear layer ``y = x W + b`` needs a ``(d_in, d_out)`` matrix; codebases store it either way::

    layout="out_in"  (d_out, d_in)   torch's nn.Linear (y = x @ weight.T), HF Llama, our state_dict
    layout="in_out"  (d_in, d_out)   GPT-2's Conv1D (y = x @ weight), JAX / Flax kernels

:func:`load_weights` takes a dict keyed by our parameter names (``model.state_dict()``'s keys)
and the layout its linear weights are in, transposes those (and only those: embeddings are
``(V, D)`` tables in every codebase, biases and norm gains are vectors), and loads them. A
square matrix looks the same either way round, so the declared layout is trusted: load
``in_out`` weights as ``out_in`` and every square projection comes in silently transposed,
which is why the layout is a required decision at the call site, not guessed from shapes.

Everything that can be checked is: a missing or unexpected key, a shape that fits neither the
parameter nor (where it differs) its transpose, and a tied head whose two names disagree.
:mod:`course_lib.model.hf` builds such a dict from HuggingFace's GPT-2 (``in_out``) and Llama
(``out_in``).

>>> from course_lib.model import GPT, ModelConfig
>>> model = GPT(ModelConfig(vocab_size=10, context_length=8, d_model=16, n_heads=2))
>>> theirs = {k: v.T if v.dim() == 2 and k in linear_weight_names(model) else v
...           for k, v in model.state_dict().items()}            # as GPT-2 or JAX would store it
>>> copy = load_weights(GPT(model.config), theirs, layout="in_out")
>>> all(torch.equal(a, b) for a, b in zip(copy.state_dict().values(), model.state_dict().values()))
True
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import Tensor, nn

__all__ = ["LAYOUTS", "linear_weight_names", "tied_names", "load_weights"]

LAYOUTS = ("out_in", "in_out")


def linear_weight_names(model: nn.Module) -> set[str]:
    """The state-dict names of every ``nn.Linear``'s weight in ``model``: the matrices a layout
    applies to (the LM head included, tied or not)."""
    return {f"{name}.weight" if name else "weight" for name, m in model.named_modules()
            if isinstance(m, nn.Linear)}


def tied_names(model: nn.Module) -> dict[str, str]:
    """``{alias: name}`` for each parameter registered under a second name, the first name it
    was registered under being ``name``: ``{"lm_head.weight": "tok_emb.weight"}`` for a tied GPT."""
    first: dict[int, str] = {}
    aliases = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        if id(p) in first:
            aliases[name] = first[id(p)]
        else:
            first[id(p)] = name
    return aliases


def _names(names, limit: int = 6) -> str:
    names = sorted(names)
    return ", ".join(names[:limit]) + (f", ... ({len(names)} in all)" if len(names) > limit else "")


def load_weights(model: nn.Module, weights: Mapping[str, Tensor], *, layout: str = "out_in") -> nn.Module:
    """Copy ``weights`` into ``model``; returns ``model``.

    ``weights`` is keyed by ``model.state_dict()``'s names. 2-D weights of ``nn.Linear`` layers
    are ``(d_out, d_in)`` with ``layout="out_in"`` (torch's own layout: a ``state_dict`` loads
    as it is) or ``(d_in, d_out)`` with ``layout="in_out"`` (transposed here); nothing else is
    ever transposed. A tied parameter's second name (``lm_head.weight`` of a tied GPT) may be
    left out; if given, it must equal the first. Raises ValueError, naming the keys, on missing
    or unexpected keys, and naming the key and both shapes on a shape that does not fit.
    """
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    expected = model.state_dict()  # name -> tensor in our (d_out, d_in) layout
    aliases, linear = tied_names(model), linear_weight_names(model)
    missing = [n for n in expected if n not in weights and n not in aliases]
    unexpected = [n for n in weights if n not in expected]
    if missing or unexpected:
        parts = [f"missing {len(missing)}: {_names(missing)}"] if missing else []
        parts += [f"unexpected {len(unexpected)}: {_names(unexpected)}"] if unexpected else []
        raise ValueError(f"weights do not match {type(model).__name__}'s parameters: " + "; ".join(parts))
    converted = {}
    for name, value in weights.items():
        if not isinstance(value, Tensor):
            raise ValueError(f"weights[{name!r}] must be a tensor, got {type(value).__name__}")
        ours = tuple(expected[name].shape)
        flip = layout == "in_out" and name in linear
        want = ours[::-1] if flip else ours
        if tuple(value.shape) != want:
            how = f"(d_in, d_out) = {want} for layout='in_out'" if flip else str(want)
            raise ValueError(f"weights[{name!r}] has shape {tuple(value.shape)}, expected {how}; the "
                             f"model's {name} is {ours}")
        converted[name] = value.detach().t() if flip else value.detach()  # (d_in, d_out) -> (d_out, d_in)
    for alias, name in aliases.items():
        if alias not in converted:
            converted[alias] = converted[name]
        elif not torch.equal(converted[alias].to(converted[name]), converted[name]):
            raise ValueError(f"{alias} is tied to {name} in this model (one tensor), but the weights give "
                             f"them different values")
    model.load_state_dict(converted, strict=True)  # copies into the existing tensors, casting dtype
    return model
