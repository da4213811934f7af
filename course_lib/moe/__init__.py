"""Mixture of experts: routing, the MoE layer, and expert parallelism (chapter 07).

The package, read in this order:

* ``routing``: pure functions of the router's logits: :func:`route` (top-K with an expert
  capacity), :func:`expert_capacity`, :func:`load_balancing_loss`, :func:`router_z_loss`;
* ``layer``: :class:`MoEConfig`, the :class:`MoE` layer that replaces a block's MLP,
  :func:`dispatch` (no loop over tokens) and :func:`moe_reference` (the loop it must equal);
* ``parallel``: :func:`expert_parallel_forward` (experts split across processes, tokens sent by
  all-to-all) and :func:`run_expert_parallel`, which simulates it on a CPU;
* ``runs`` (``moe.runs``, loaded on first use: it builds GPTs, and the GPT imports this
  package): the chapter's dense and MoE training runs and their shipped CSV
  (``python -m course_lib.moe runs``).

Shapes: ``T`` tokens, ``D`` d_model, ``E`` experts, ``K`` experts per token.
"""

import importlib

from .layer import MoE, MoEConfig, aux_loss, combine, dispatch, moe_reference, run_experts, sort_choices
from .parallel import ExpertParallelResult, expert_parallel_forward, run_expert_parallel
from .routing import Routing, expert_capacity, load_balancing_loss, route, router_z_loss

__all__ = ["Routing", "route", "expert_capacity", "load_balancing_loss", "router_z_loss", "MoEConfig", "MoE",
           "sort_choices", "run_experts", "combine", "dispatch", "moe_reference", "aux_loss",
           "expert_parallel_forward", "ExpertParallelResult", "run_expert_parallel"]


def __getattr__(name: str):
    if name == "runs":  # imported late: course_lib.model imports this package
        return importlib.import_module(".runs", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
