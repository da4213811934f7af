"""Benchmark course_lib.attention against torch on the same work (chapter 02).

Run from the repository root: ``python benchmarks/bench_attention.py`` (``--batch``,
``--repeats`` to change the work). Prints milliseconds and ratios; targets from the design:

1. causal attention, B x H=8 x S x Dh=64, S in {128, 512, 1024}, forward and
   forward+backward: ``impl="sdpa"`` with ``causal_mask(S)`` within 1.1x of
   ``F.scaled_dot_product_attention(is_causal=True)`` (a plain causal mask is detected and
   passed as ``is_causal=True``); ``impl="naive"`` printed beside it for scale;
2. non-causal linear attention vs softmax attention (sdpa) at S in {1024, 4096}, forward;
3. decoding 256 tokens through 4 ``MultiHeadAttention`` layers (D=256, H=8, batch 1) with a
   ``KVCache`` vs recomputing the whole prefix every step.

Timings are medians of ``torch.utils.benchmark.Timer.blocked_autorange`` (1 and 2) or of
``--repeats`` runs (3), in the process's default thread count.
"""

from __future__ import annotations

import argparse
import os
import platform
import time

import torch
import torch.nn.functional as F
from torch.utils import benchmark

from course_lib import attention as A


def median_ms(min_run_time: float, fn, *args, **kwargs) -> float:
    """Median milliseconds of ``fn(*args, **kwargs)`` over Timer's blocks."""
    timer = benchmark.Timer("fn(*args, **kwargs)", globals={"fn": fn, "args": args, "kwargs": kwargs})
    return timer.blocked_autorange(min_run_time=min_run_time).median * 1e3


def torch_causal(q, k, v, mask):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def ours_sdpa(q, k, v, mask):
    return A.scaled_dot_product_attention(q, k, v, mask, impl="sdpa")


def ours_naive(q, k, v, mask):
    return A.scaled_dot_product_attention(q, k, v, mask, impl="naive")


def forward_backward(fn, q, k, v, mask, grad):
    return torch.autograd.grad(fn(q, k, v, mask), (q, k, v), grad)


def causal_sdpa(batch: int, min_run_time: float) -> None:
    H, Dh = 8, 64
    print(f"\n1. causal attention, B={batch}, H={H}, Dh={Dh}, fp32 (ms; ratio = time / torch is_causal)")
    print(f"{'S':>5} {'pass':>9} {'torch':>9} {'sdpa':>9} {'ratio':>6} {'naive':>9} {'ratio':>6}")
    fns = {"torch": torch_causal, "sdpa": ours_sdpa, "naive": ours_naive}
    for S in (128, 512, 1024):
        q, k, v = (torch.randn(batch, H, S, Dh, requires_grad=True) for _ in range(3))
        mask, grad = A.causal_mask(S), torch.randn(batch, H, S, Dh)
        for name in ("forward", "fwd+bwd"):
            ms = {}
            for impl, fn in fns.items():
                if name == "forward":
                    with torch.no_grad():
                        ms[impl] = median_ms(min_run_time, fn, q, k, v, mask)
                else:
                    ms[impl] = median_ms(min_run_time, forward_backward, fn, q, k, v, mask, grad)
            print(f"{S:>5} {name:>9} {ms['torch']:9.2f} {ms['sdpa']:9.2f} {ms['sdpa'] / ms['torch']:6.2f} "
                  f"{ms['naive']:9.2f} {ms['naive'] / ms['torch']:6.2f}")


def linear_vs_softmax(min_run_time: float) -> None:
    B, H, Dh = 1, 8, 64
    print(f"\n2. non-causal linear vs softmax attention, forward, B={B}, H={H}, Dh={Dh} (ms)")
    print(f"{'S':>5} {'softmax':>9} {'linear':>9} {'softmax/linear':>15}")
    for S in (1024, 4096):
        q, k, v = (torch.randn(B, H, S, Dh) for _ in range(3))
        with torch.no_grad():
            soft = median_ms(min_run_time, A.scaled_dot_product_attention, q, k, v, impl="sdpa")
            lin = median_ms(min_run_time, A.linear_attention, q, k, v)
        print(f"{S:>5} {soft:9.2f} {lin:9.2f} {soft / lin:15.1f}")


def decoding(repeats: int, n_tokens: int = 256) -> None:
    D, H, L = 256, 8, 4
    torch.manual_seed(0)
    layers = [A.MultiHeadAttention(D, H, impl="sdpa").eval() for _ in range(L)]
    x = torch.randn(1, n_tokens, D)  # stands in for the embeddings of the generated tokens

    def with_cache():
        caches = [A.KVCache(1, H, D // H, n_tokens) for _ in range(L)]
        for t in range(n_tokens):
            h = x[:, t:t + 1]  # (1, 1, D): only the new token
            for layer, cache in zip(layers, caches, strict=True):
                h = layer(h, cache=cache)

    def recompute():
        for t in range(n_tokens):
            h = x[:, :t + 1]  # (1, t + 1, D): the whole prefix again
            mask = A.causal_mask(t + 1)
            for layer in layers:
                h = layer(h, mask=mask)

    times = {}
    for name, fn in (("cache", with_cache), ("recompute", recompute)):
        runs = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            with torch.no_grad():
                fn()
            runs.append(time.perf_counter() - t0)
        times[name] = sorted(runs)[len(runs) // 2] * 1e3
    print(f"\n3. decoding {n_tokens} tokens, {L} attention layers (D={D}, H={H}), batch 1 (ms, median "
          f"of {repeats})\n   KV cache {times['cache']:.1f}   recompute prefix {times['recompute']:.1f}   "
          f"recompute/cache {times['recompute'] / times['cache']:.1f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=8, help="batch size for the causal benchmark")
    parser.add_argument("--min-run-time", type=float, default=1.0, help="seconds per Timer measurement")
    parser.add_argument("--repeats", type=int, default=3, help="runs of the decoding benchmark")
    args = parser.parse_args()
    print(f"torch {torch.__version__}, {platform.machine()}, {os.cpu_count()} CPUs, "
          f"{torch.get_num_threads()} threads")
    causal_sdpa(args.batch, args.min_run_time)
    linear_vs_softmax(args.min_run_time)
    decoding(args.repeats)


if __name__ == "__main__":
    main()
