"""Expert parallelism: experts split across processes, tokens sent to them by all-to-all (chapter 07).

Shapes: ``T`` tokens on this rank, ``D`` d_model, ``E`` experts, ``W`` processes (ranks), ``A``
kept choices on this rank.

GShard (Lepikhin et al., 2021) and the Switch Transformer put different experts on different
devices. With ``W`` ranks, rank ``r`` holds experts ``r E/W .. (r+1) E/W - 1`` and the router
(replicated); every rank routes *its own* tokens, then::

    rank 0: x0 --route--> choices for e0 e1 | e2 e3          rank 1: x1 --route--> e0 e1 | e2 e3
                              |          \\________________________________________/      |
                              |           ________________________________________/\\     |
                              v          v                                           v    v
    all-to-all #1:   rank 0 gets every token sent to e0, e1;   rank 1 every token sent to e2, e3
    experts:         each rank runs its experts on what it received
    all-to-all #2:   outputs go back to the ranks the tokens came from
    combine:         y[t] = sum_k gate[t, k] * output   (on the token's own rank)

An all-to-all is its own adjoint: the backward pass sends the gradients back along the same
routes with the roles of sender and receiver swapped (:class:`_AllToAll`), so each expert's
gradient collects the contributions of every rank's tokens. The router is replicated, so its
gradient must be summed over ranks (an all-reduce, which DDP would do). The result equals one
process that holds every expert and runs the layer on each rank's tokens (each rank's tokens are
routed with the capacity of its own batch, as in a real system).

:func:`run_expert_parallel` simulates this on a CPU with ``W`` processes and the gloo backend.

Left out: overlapping communication with computation, fixed-size buffers (real systems send
``capacity`` slots per expert so the all-to-all has static shapes), and hierarchical all-to-all.
"""

from __future__ import annotations

import copy
import os
import tempfile
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import Tensor

from .layer import MoE, combine, run_experts, sort_choices

__all__ = ["expert_parallel_forward", "ExpertParallelResult", "run_expert_parallel"]


class _AllToAll(torch.autograd.Function):
    """``dist.all_to_all_single`` with a backward pass: the reverse all-to-all of the gradients."""

    @staticmethod
    def forward(ctx, x: Tensor, recv_counts: list[int], send_counts: list[int], group) -> Tensor:
        ctx.counts, ctx.group = (recv_counts, send_counts), group
        out = x.new_empty(sum(recv_counts), *x.shape[1:])  # (A_in, D)
        dist.all_to_all_single(out, x.contiguous(), recv_counts, send_counts, group=group)
        return out

    @staticmethod
    def backward(ctx, grad: Tensor):
        recv_counts, send_counts = ctx.counts
        back = grad.new_empty(sum(send_counts), *grad.shape[1:])  # (A, D)
        dist.all_to_all_single(back, grad.contiguous(), send_counts, recv_counts, group=ctx.group)
        return back, None, None, None


def expert_parallel_forward(layer: MoE, x: Tensor, group=None) -> tuple[Tensor, list[int]]:
    """``(..., D) -> (..., D)`` on this rank, using only this rank's experts of ``layer``.

    Every rank calls it with its own tokens ``x`` and an identical ``layer``. Returns the output
    and ``send_counts``: how many choices this rank sent to each rank.
    """
    W, rank = dist.get_world_size(group), dist.get_rank(group)
    E, D = layer.config.n_experts, layer.router.in_features
    if E % W:
        raise ValueError(f"n_experts={E} must be divisible by the number of ranks W={W}")
    per_rank = E // W
    tokens = x.reshape(-1, D)  # (..., D) -> (T, D)
    _, routing = layer.route(tokens)
    token, expert, gate = sort_choices(routing)  # (A,) each, grouped by expert, so by rank

    send = torch.bincount(expert // per_rank, minlength=W)  # (W,) choices for each rank
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send, group=group)  # how many choices each rank sends here
    send_counts, recv_counts = send.tolist(), recv.tolist()

    x_in = _AllToAll.apply(tokens[token], recv_counts, send_counts, group)  # (A, D) -> (A_in, D)
    e_in = expert.new_empty(sum(recv_counts))
    dist.all_to_all_single(e_in, expert, recv_counts, send_counts, group=group)  # their experts
    order = torch.argsort(e_in, stable=True)  # arrivals come grouped by sender: regroup by expert
    mine = layer.experts[rank * per_rank:(rank + 1) * per_rank]
    out = torch.empty_like(x_in)
    out[order] = run_experts(x_in[order], e_in[order], mine, first=rank * per_rank)  # (A_in, D)
    out = _AllToAll.apply(out, send_counts, recv_counts, group)  # (A_in, D) -> (A, D), back home
    return combine(out, token, gate, len(tokens)).view(x.shape), send_counts


@dataclass
class ExpertParallelResult:
    """What :func:`run_expert_parallel` measured."""

    outputs: list[Tensor]     # rank r's output for its shard, (..., D)
    grads: dict[str, Tensor]  # every parameter of the layer: experts' from their rank, router summed
    sent: list[list[int]]     # sent[i][j]: choices rank i sent to rank j


def _worker(rank: int, layer: MoE, shards: list[Tensor], upstream: list[Tensor], init_file: str,
            out_dir: str) -> None:
    torch.set_num_threads(1)
    world = len(shards)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        y, sent = expert_parallel_forward(layer, shards[rank])
        ((y * upstream[rank]).sum() + layer.aux_loss).backward()
        dist.all_reduce(layer.router.weight.grad)  # the replicated router: sum over ranks
        per_rank = layer.config.n_experts // world
        grads = {name: p.grad for name, p in layer.named_parameters()
                 if not name.startswith("experts.") or int(name.split(".")[1]) // per_rank == rank}
        torch.save({"y": y.detach(), "grads": grads, "sent": sent}, os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


def run_expert_parallel(layer: MoE, shards: list[Tensor], upstream: list[Tensor] | None = None
                        ) -> ExpertParallelResult:
    """Run ``layer`` expert-parallel over ``W = len(shards)`` CPU processes (gloo), rank ``r`` on
    ``shards[r]``, and backpropagate ``sum_r <y_r, upstream[r]> + aux losses`` (``upstream``
    defaults to ones). The single-process equivalent::

        for r: y_r = layer(shards[r]); loss += (y_r * upstream[r]).sum() + layer.aux_loss

    Takes a few seconds: each process starts a Python interpreter and imports torch.
    """
    W = len(shards)
    if W < 2:
        raise ValueError(f"need at least 2 shards (one per process), got {W}")
    if layer.config.n_experts % W:
        raise ValueError(f"n_experts={layer.config.n_experts} must be divisible by W={W} processes")
    upstream = [torch.ones_like(s) for s in shards] if upstream is None else upstream
    layer = copy.deepcopy(layer).cpu()  # the caller's layer and its gradients stay untouched
    layer.zero_grad(set_to_none=True)
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(_worker, args=(layer, shards, upstream, os.path.join(tmp, "init"), tmp), nprocs=W)
        results = [torch.load(os.path.join(tmp, f"rank{r}.pt"), weights_only=True) for r in range(W)]
    grads = {}
    for result in results:
        grads.update(result["grads"])  # experts from their owners; the router is equal everywhere
    return ExpertParallelResult(outputs=[r["y"] for r in results], grads=grads,
                                sent=[r["sent"] for r in results])
