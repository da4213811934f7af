"""Mixture of experts: routing, the MoE layer, and expert parallelism (chapter 07).

The package, read in this order:

* ``routing``: pure functions of the router's logits: :func:`route` (top-K with an expert
  capacity), :func:`expert_capacity`, :func:`load_balancing_loss`, :func:`router_z_loss`;
* ``layer``: :class:`MoEConfig`, the :class:`MoE` layer that replaces a block's MLP,
  :func:`dispatch` (no loop over tokens) and :func:`moe_reference` (the loop it must equal);
* ``parallel``: :func:`expert_parallel_forward` (experts split across processes, tokens sent by
  all-to-all) and :func:`run_expert_parallel`, which simulates it on a CPU.

The package depends on nothing in :mod:`course_lib.model`: an expert is any module passed in
(the GPT passes its MLP). The chapter's dense-against-MoE training runs build GPTs, so they
live outside it, in :mod:`course_lib.moe_runs` (``python -m course_lib.moe_runs train``).

Shapes: ``T`` tokens, ``D`` d_model, ``E`` experts, ``K`` experts per token.
"""

from .layer import MoE, MoEConfig, aux_loss, combine, dispatch, moe_reference, run_experts, sort_choices
from .parallel import ExpertParallelResult, expert_parallel_forward, run_expert_parallel
from .routing import Routing, expert_capacity, load_balancing_loss, route, router_z_loss

__all__ = ["Routing", "route", "expert_capacity", "load_balancing_loss", "router_z_loss", "MoEConfig", "MoE",
           "sort_choices", "run_experts", "combine", "dispatch", "moe_reference", "aux_loss",
           "expert_parallel_forward", "ExpertParallelResult", "run_expert_parallel"]

