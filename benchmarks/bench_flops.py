"""Benchmark the machine rates that course_lib.flops measures (chapter 05).

Run from the repository root: ``python benchmarks/bench_flops.py`` (``--device cuda`` on a
GPU). Prints, for this machine and device:

1. the matmul rate (``flops.matmul_flops_per_second``) in fp32 and bf16 at n = 512, 1024,
   2048 (and 4096, 8192 on CUDA): the largest is the peak that MFU divides by;
2. the elementwise rate (``a * b + c``, ``flops.elementwise_flops_per_second``) and its ratio
   to the fp32 matmul peak (the second deck: peak speed comes only during matmuls);
3. a training step (forward, backward, AdamW) of course_lib GPTs at two sizes (on CUDA also
   GPT-2 small, d_model 768, and each size under bf16 autocast too): tokens/s, model FLOP/s
   from ``flops.training_flops`` and the MFU against the measured peak of that precision.
"""

from __future__ import annotations

import argparse
import os
import platform
import time

import torch

from course_lib import device as devices
from course_lib import flops, model

SIZES = {  # name: (config, batch)
    "L4 H4 D128 S64": (model.ModelConfig(vocab_size=256, context_length=64, d_model=128, n_layers=4,
                                         n_heads=4, attn_impl="sdpa"), 12),
    "L6 H6 D384 S256": (model.ModelConfig(vocab_size=256, context_length=256, d_model=384, n_layers=6,
                                          n_heads=6, attn_impl="sdpa"), 8),
}
CUDA_SIZES = {  # GPT-2 small: d_model 768
    "L12 H12 D768 S1024": (model.ModelConfig(vocab_size=256, context_length=1024, d_model=768, n_layers=12,
                                             n_heads=12, attn_impl="sdpa"), 16),
}


def training_tokens_per_second(config: model.ModelConfig, batch: int, dev: torch.device, steps: int,
                                precision: str = "fp32") -> float:
    gpt = model.GPT(config).to(dev)
    opt = torch.optim.AdamW(gpt.parameters(), lr=1e-4)
    ids = torch.randint(0, config.vocab_size, (batch, config.context_length + 1), device=dev)

    def step():
        with devices.autocast(dev, precision):
            _, loss = gpt(ids[:, :-1], ids[:, 1:])
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    def sync():
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)

    step()  # warm-up
    sync()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    sync()
    return batch * config.context_length * steps / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default=None, help="cpu, cuda or auto (default: $COURSE_DEVICE or auto)")
    parser.add_argument("--steps", type=int, default=10, help="timed training steps per size")
    args = parser.parse_args()
    dev = devices.get_device(args.device)
    print(f"{platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads, device {dev}")

    peaks = {}
    for dtype in (torch.float32, torch.bfloat16):
        sizes = (512, 1024, 2048, 4096, 8192) if dev.type == "cuda" else (512, 1024, 2048)
        rates = {n: flops.matmul_flops_per_second(n, dtype, dev) for n in sizes}
        peaks[dtype] = max(rates.values())
        cells = "".join(f"  n={n}: {r / 1e9:8.1f} GFLOP/s" for n, r in rates.items())
        print(f"matmul {str(dtype):15s}{cells}")
    elementwise = flops.elementwise_flops_per_second(1 << 24, torch.float32, dev)
    print(f"elementwise a * b + c (fp32, 16M values): {elementwise / 1e9:.2f} GFLOP/s, "
          f"{peaks[torch.float32] / elementwise:.0f}x below the fp32 matmul peak")

    on_cuda = dev.type == "cuda"
    for name, (config, batch) in (SIZES | CUDA_SIZES if on_cuda else SIZES).items():
        for precision, dtype in [("fp32", torch.float32)] + [("bf16", torch.bfloat16)] * on_cuda:
            tps = training_tokens_per_second(config, batch, dev, args.steps, precision)
            achieved = flops.training_flops(config, 1, config.context_length) * tps
            mfu = flops.mfu(achieved, peaks[dtype])
            print(f"training {name} B{batch} ({precision}): {tps:9,.0f} tokens/s, "
                  f"{achieved / 1e9:7.1f} GFLOP/s, MFU {mfu:.1%} of the {precision} peak")


if __name__ == "__main__":
    main()
