"""Benchmark course_lib.optim on chapter 03's character model: AdamW against torch's, Muon against AdamW.

Run from the repository root: ``python benchmarks/bench_optim.py`` (``--steps`` to shorten the
schedule, ``--muon-lr``, ``--device``; ``--quick`` for a smoke run of a few seconds). The model
and training settings are chapter 03's, copied from its training cell (change them here if the
chapter changes): 1 M characters of Shakespeare as bytes, ``ModelConfig(vocab_size=256,
context_length=64, d_model=128, n_layers=2, n_heads=4, positional="rope", norm="rmsnorm",
mlp="swiglu")``, ``TrainConfig(max_steps=400, batch_size=32, lr=3e-3, min_lr=3e-4,
warmup_steps=30)``; fp32. Prints:

1. three runs of ``train.train`` from the same seed and initial weights, one per
   ``TrainConfig.optimizer``: ``"torch-adamw"``, ``"adamw"`` (course_lib's) and ``"muon"``
   (hidden matrices at ``muon_lr``, the rest AdamW): validation loss along the run and at the
   end, tokens/s (wall time of the run, its 5 evaluations of 8 batches included), the time
   ratio to torch's AdamW, and whether the two AdamW loss histories are equal;
2. the step time of each optimizer, measured in the same process with the runs interleaved
   (the order rotates each of 3 rounds; medians of ``Timer.blocked_autorange``): ``step()``
   alone on fixed gradients, and a whole training step (forward, backward, clipping, step)
   on one batch, with the ratio to ``torch.optim.AdamW``.

The runs are sequential (each is a whole training run, after 3 untimed warm-up steps of each),
so machine noise shows in tokens/s. The chapter's 400 steps take ~3.5 min for the three runs on
2 CPU cores; ``--steps 300`` keeps the benchmark under 3 min.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import platform
import statistics
import time

import torch
from torch.utils import benchmark

from course_lib import data, device, model, optim, train

CHAR_CONFIG = model.ModelConfig(vocab_size=256, context_length=64, d_model=128, n_layers=2, n_heads=4,
                                positional="rope", norm="rmsnorm", mlp="swiglu", attn_impl="sdpa")
CHAPTER_TRAIN = train.TrainConfig(max_steps=400, batch_size=32, lr=3e-3, min_lr=3e-4, warmup_steps=30,
                                  eval_every=100, eval_batches=8, precision="fp32")
OPTIMIZERS = ("torch-adamw", "adamw", "muon")


def fresh_model(config: model.ModelConfig) -> model.GPT:
    torch.manual_seed(0)  # the same initial weights for every optimizer
    return model.GPT(config)


def median_ms(stmt: str, env: dict, min_run_time: float) -> float:
    timer = benchmark.Timer(stmt, globals=env, num_threads=torch.get_num_threads())  # default: 1 thread
    return timer.blocked_autorange(min_run_time=min_run_time).median * 1e3


def interleaved_ms(envs: dict[str, dict], stmt: str, repeats: int, min_run_time: float) -> dict[str, float]:
    """Median over ``repeats`` rounds of each name's median time; the order rotates every round,
    so that a burst of load on the machine hits every optimizer alike."""
    times: dict[str, list[float]] = {name: [] for name in envs}
    names = list(envs)
    for r in range(repeats):
        for name in names[r % len(names):] + names[:r % len(names)]:
            times[name].append(median_ms(stmt, envs[name], min_run_time))
    return {name: statistics.median(t) for name, t in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=CHAPTER_TRAIN.max_steps)
    parser.add_argument("--muon-lr", type=float, default=CHAPTER_TRAIN.muon_lr)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--quick", action="store_true", help="20 steps on 100k characters")
    args = parser.parse_args()
    steps = 20 if args.quick else args.steps
    config = dataclasses.replace(CHAPTER_TRAIN, max_steps=steps, warmup_steps=min(30, steps // 10),
                                 eval_every=max(1, steps // 4), muon_lr=args.muon_lr, device=args.device)
    dev = device.get_device(args.device)
    print(f"machine: {platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads, device {dev}")

    text = data.shakespeare(max_chars=100_000 if args.quick else 1_000_000)
    train_ids, val_ids = data.train_val_split(data.encode_corpus(text), val_fraction=0.1)
    tokens = steps * config.batch_size * CHAR_CONFIG.context_length
    print(f"\n1. {steps} steps of B = {config.batch_size}, S = {CHAR_CONFIG.context_length} "
          f"({tokens:,} tokens), lr {config.lr} -> {config.min_lr}, muon_lr {config.muon_lr}")
    print(f"{'optimizer':12s} {'validation loss along the run':>42s} {'final':>7s} {'s':>6s} "
          f"{'tokens/s':>9s} {'time ratio':>10s}")
    for name in OPTIMIZERS:  # warm-up, untimed: the first steps of a process are slow (allocations, kernels)
        warm = dataclasses.replace(config, optimizer=name, max_steps=3, warmup_steps=1, eval_every=3)
        train.train(fresh_model(CHAR_CONFIG), train_ids, val_ids, warm, progress=False)
    histories, walls = {}, {}
    for name in OPTIMIZERS:
        start = time.perf_counter()
        h = train.train(fresh_model(CHAR_CONFIG), train_ids, val_ids,
                        dataclasses.replace(config, optimizer=name), progress=False)
        histories[name] = h
        walls[name] = seconds = time.perf_counter() - start
        along = " ".join(f"{v:.3f}" for v in h.val_loss[:-1])
        ratio = seconds / walls["torch-adamw"]
        print(f"{name:12s} {along:>42s} {h.val_loss[-1]:7.3f} {seconds:6.1f} {tokens / seconds:9,.0f} "
              f"{ratio:10.2f}")
    same = histories["adamw"].train_loss == histories["torch-adamw"].train_loss
    gap = max(abs(a - b) for a, b in zip(histories["adamw"].train_loss, histories["torch-adamw"].train_loss,
                                          strict=True))
    print(f"course_lib AdamW loss history == torch's: {same} (max |difference| {gap:.2e})")

    print("\n2. step time, medians of interleaved repeats (ms; ratio = time / torch AdamW's)")
    x, y = data.get_batch(train_ids.to(dev), config.batch_size, CHAR_CONFIG.context_length,
                          generator=torch.Generator().manual_seed(0))
    envs = {}
    for name in OPTIMIZERS:
        gpt = fresh_model(CHAR_CONFIG).to(dev)
        opt = train.make_optimizer(gpt, dataclasses.replace(config, optimizer=name))
        gpt(x, y)[1].backward()  # gradients for the step() timing below, which reuses them
        envs[name] = {"gpt": gpt, "opt": opt, "x": x, "y": y, "clip": optim.clip_grad_norm}
    full_step = ("opt.zero_grad(set_to_none=True); gpt(x, y)[1].backward(); "
                 "clip(gpt.parameters(), 1.0); opt.step()")
    repeats, run_time = (1, 0.2) if args.quick else (3, 1.0)
    step_alone = interleaved_ms(envs, "opt.step()", repeats, run_time)
    whole = interleaved_ms(envs, full_step, repeats, run_time)
    print(f"{'optimizer':12s} {'step() alone':>12s} {'ratio':>6s} {'training step':>14s} {'ratio':>6s}")
    for name in OPTIMIZERS:
        print(f"{name:12s} {step_alone[name]:12.2f} {step_alone[name] / step_alone['torch-adamw']:6.2f} "
              f"{whole[name]:14.1f} {whole[name] / whole['torch-adamw']:6.2f}")

if __name__ == "__main__":
    main()
