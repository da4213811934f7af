"""Benchmark course_lib.lora: a LoRA fine-tuning step against a full one, and LoRALinear against peft
(chapter 08).

Run from the repository root: ``python benchmarks/bench_lora.py``. fp32, on the CPU by default
(``--device``):

1. one training step (forward, backward, AdamW) of the shipped chapter 03 model on 8 windows of
   128 bytes: all parameters against LoRA on q, v (rank 4) and on every projection (rank 8);
   the ratio is the time of a LoRA step over a full step;
2. forward + backward of one adapted 1024 x 1024 layer on 4096 tokens: ``lora.LoRALinear``
   against peft's LoRA layer with the same weights (peft is a test dependency).

Timings are medians of ``torch.utils.benchmark.Timer.blocked_autorange``.
"""

from __future__ import annotations

import argparse
import copy
import os
import platform

import torch
from torch import nn
from torch.utils import benchmark

from course_lib import device as dev
from course_lib import lora, pretrained


def median_ms(fn, min_run_time: float = 2.0) -> float:
    timer = benchmark.Timer("fn()", globals={"fn": fn})
    return timer.blocked_autorange(min_run_time=min_run_time).median * 1e3


def training_step(model: nn.Module, x, y):
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)

    def run():
        optimizer.zero_grad(set_to_none=True)
        model(x, y)[1].backward()
        optimizer.step()
    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    device = dev.get_device(args.device)
    print(f"machine: {platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads, device {device}")
    torch.manual_seed(0)

    base = pretrained.load().to(device).train()
    x = torch.randint(0, 256, (8, 128), device=device)
    variants = {"full fine-tuning": None,
                "LoRA q, v, R = 4": lora.LoRAConfig(rank=4, alpha=8.0, targets=("q_proj", "v_proj")),
                "LoRA all projections, R = 8": lora.LoRAConfig(rank=8, targets=("attn", "mlp"))}
    print("\n1. one training step of the chapter 03 model, B = 8, S = 128, fp32 (ms; ratio = time / full)")
    print(f"{'':30s} {'trainable':>10s} {'AdamW state':>12s} {'ms':>8s} {'ratio':>6s}")
    t_full = None
    for name, config in variants.items():
        model = copy.deepcopy(base)
        if config is not None:
            lora.apply_lora(model, config)
        t = median_ms(training_step(model, x, x))
        t_full = t_full or t
        trainable, state = lora.trainable_parameters(model)[0], lora.adamw_state_bytes(model)
        print(f"{name:30s} {trainable:10,d} {state / 1e3:9.1f} kB {t:8.2f} {t / t_full:6.2f}")

    import peft  # test dependency: pip install -e ".[test]"

    print("\n2. one adapted 1024 x 1024 layer, 4096 tokens, R = 16, forward + backward "
          "(ms; ratio = ours / peft)")
    D, R = 1024, 16
    ours = lora.LoRALinear(nn.Linear(D, D), rank=R, alpha=32.0).to(device)
    with torch.no_grad():
        ours.B.normal_()
    theirs = peft.get_peft_model(nn.Sequential(copy.deepcopy(ours.base)),
                                 peft.LoraConfig(r=R, lora_alpha=32, target_modules=["0"])).to(device)
    layer = theirs.base_model.model[0]
    with torch.no_grad():
        layer.lora_A["default"].weight.copy_(ours.A.T)
        layer.lora_B["default"].weight.copy_(ours.B.T)
    tokens = torch.randn(4096, D, device=device, requires_grad=True)
    torch.testing.assert_close(ours(tokens), theirs(tokens))
    t_ours = median_ms(lambda: ours(tokens).sum().backward())
    t_peft = median_ms(lambda: theirs(tokens).sum().backward())
    print(f"course_lib {t_ours:.2f}, peft {t_peft:.2f}: ratio {t_ours / t_peft:.2f}")


if __name__ == "__main__":
    main()
