"""Benchmark the course_lib MoE layer against a dense MLP and against the token loop (chapter 07).

Run from the repository root: ``python benchmarks/bench_moe.py`` (``--tokens``, ``--device``).
Forward + backward of one feed-forward layer on ``T`` tokens of width ``D``, fp32:

1. ``MoE`` (E experts of width F, top-1 and top-2 with experts of width F / 2) against a dense
   ``MLP`` of width F: the same *active* parameters and matmul FLOPs per token, so the ratio is
   the price of routing, sorting and scattering (plus the router's own small matmul);
2. the same layer against :func:`course_lib.moe.moe_reference`, the loop over tokens it replaces
   (on fewer tokens: the loop is slow).

Timings are medians of ``torch.utils.benchmark.Timer.blocked_autorange``.
"""

from __future__ import annotations

import argparse
import os
import platform

import torch
from torch.utils import benchmark

from course_lib import device as dev
from course_lib import moe
from course_lib.model import MLP, ModelConfig, feed_forward


def median_ms(fn, min_run_time: float = 1.0) -> float:
    timer = benchmark.Timer("fn()", globals={"fn": fn})
    return timer.blocked_autorange(min_run_time=min_run_time).median * 1e3


def forward_backward(layer, x):
    def run():
        layer.zero_grad(set_to_none=True)
        layer(x).square().mean().backward()
    return run


def reference(layer: moe.MoE, x):
    c = layer.config
    cap = moe.expert_capacity(len(x), c.n_experts, c.top_k, c.capacity_factor)

    def run():
        layer.zero_grad(set_to_none=True)
        moe.moe_reference(x, layer.router_logits(x), layer.experts, c.top_k, cap, c.renormalize
                          ).square().mean().backward()
    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=4096, help="T tokens per pass (B S)")
    parser.add_argument("--d-model", type=int, default=256)
    parser.add_argument("--device", default="auto")
    args = parser.parse_args()
    device = dev.get_device(args.device)
    D, F_ = args.d_model, 4 * args.d_model
    print(f"machine: {platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads, device {device}")
    torch.manual_seed(0)
    x = torch.randn(args.tokens, D, device=device)

    dense = MLP(ModelConfig(d_model=D, d_ff=F_)).to(device)
    t_dense = median_ms(forward_backward(dense, x))
    print(f"\n1. forward + backward, T={args.tokens}, D={D}, fp32 (ms; ratio = time / dense MLP)")
    print(f"{'layer':<38} {'params':>9} {'ms':>8} {'ratio':>6}")
    print(f"{'dense MLP, F=' + str(F_):<38} {sum(p.numel() for p in dense.parameters()):>9,} "
          f"{t_dense:8.2f} {1.0:6.2f}")
    layers = {}
    for E in (4, 8, 16):
        for K, width in ((1, F_), (2, F_ // 2)):
            cfg = ModelConfig(d_model=D, d_ff=width, moe=moe.MoEConfig(n_experts=E, top_k=K))
            layer = feed_forward(cfg).to(device)
            layers[E, K] = layer
            t = median_ms(forward_backward(layer, x))
            name = f"MoE E={E}, K={K}, F={width}, factor 1.25"
            print(f"{name:<38} {sum(p.numel() for p in layer.parameters()):>9,} {t:8.2f} {t / t_dense:6.2f}")

    T_small = 256
    xs = x[:T_small]
    print(f"\n2. the same layer vs the loop over tokens, T={T_small} (ms; ratio = loop / ours)")
    print(f"{'layer':<20} {'ours':>8} {'loop':>9} {'ratio':>6}")
    for (E, K), layer in layers.items():
        if E == 16:
            continue
        ours, loop = median_ms(forward_backward(layer, xs)), median_ms(reference(layer, xs), 2.0)
        print(f"{f'E={E}, K={K}':<20} {ours:8.2f} {loop:9.2f} {loop / ours:6.1f}")


if __name__ == "__main__":
    main()
