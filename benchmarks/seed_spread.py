"""Check chapter 08's fine-tuning claims over several seeds: each was drawn from one run.

Run from the repository root: ``python benchmarks/seed_spread.py`` (``--seeds``, ``--steps``,
``--batch-size``, ``--out``; on a shared machine set ``OMP_WAIT_POLICY=PASSIVE``, or each step
can take ten times longer). For each seed s, the chapter's six fine-tunings of the shipped model
on stage directions (its recipe: 50 steps, batches of 4 windows of 128 bytes, lr 1e-3 for full
fine-tuning and 1e-2 for LoRA, alpha = 2 R, evaluated on 4 batches every 10 steps), with s
seeding LoRA's A initialisation, the batches and the evaluation windows (the base model is
evaluated on the same windows). Seed 0 is the chapter's own run.

Each final validation loss is appended to ``course_lib/results/lora_seeds.csv`` as one row
(``steps, batch_size, seed, run, loss``) as soon as it exists; runs already in the file are not
run again. Chapter 08 reads that file for its statements over seeds (the shares of rank 16's
gain and the paired differences, seed by seed). For one seed, a difference of a few hundredths
between two runs may be batch order or initialisation rather than the method; the differences
between two runs on the same seed share the batches and the evaluation windows, so they vary
much less than the losses do. Per seed it checks:

(a) full fine-tuning ends clearly below LoRA q, v at R = 4 (by at least ``CLEAR`` nats per byte);
(b) diminishing returns: going from R = 1 to R = 4 (q, v) lowers the loss more than twice as much
    as going from R = 4 to R = 16;
(c) at the same number of trainable parameters, q, k, v, o at R = 2 ends below q at R = 8;
(c') and q, v at R = 4 ends between them.
"""

from __future__ import annotations

import argparse
import copy
import csv
import dataclasses
import os
import platform
import statistics
import time
from pathlib import Path

import torch

from course_lib import data, lora, pretrained, sweeps, train
from course_lib import device as dev

OUT = Path(__file__).resolve().parents[1] / "course_lib" / "results" / "lora_seeds.csv"
COLUMNS = ("steps", "batch_size", "seed", "run", "loss")
CLEAR = 0.05  # nats per byte: what "clearly below" means in claim (a)
RUNS = {  # name in the CSV: (targets, rank); "base" is the model before fine-tuning, "full" all parameters
    "full": None,
    "qv_r1": (("q_proj", "v_proj"), 1),
    "qv_r4": (("q_proj", "v_proj"), 4),
    "qv_r16": (("q_proj", "v_proj"), 16),
    "q_r8": (("q_proj",), 8),
    "qkvo_r2": (("q_proj", "k_proj", "v_proj", "o_proj"), 2),
}
CLAIMS = {
    "(a) full clearly below q,v R=4": lambda v: v["full"] < v["qv_r4"] - CLEAR,
    "(b) R=1 -> 4 gains > 2x R=4 -> 16 (q,v)":
        lambda v: v["qv_r1"] - v["qv_r4"] > 2 * (v["qv_r4"] - v["qv_r16"]),
    "(c) q,k,v,o R=2 below q R=8": lambda v: v["qkvo_r2"] < v["q_r8"],
    "(c') q,v R=4 between them": lambda v: v["qkvo_r2"] < v["qv_r4"] < v["q_r8"],
}


def finetune(base, train_ids, val_ids, recipe, run, seed: int) -> float:
    """Final validation loss of one fine-tuning of a copy of ``base``, everything seeded with ``seed``."""
    m = copy.deepcopy(base).train()
    torch.manual_seed(seed)  # LoRA's A
    if run is not None:
        targets, rank = run
        lora.apply_lora(m, lora.LoRAConfig(rank=rank, alpha=2.0 * rank, targets=targets))
        recipe = dataclasses.replace(recipe, lr=1e-2)
    return train.train(m, train_ids, val_ids, recipe, progress=False).val_loss[-1]


def read(path: Path, steps: int, batch_size: int) -> dict[str, dict[int, float]]:
    """``{run: {seed: loss}}`` for one recipe, from the CSV at ``path`` (empty if there is none)."""
    out: dict[str, dict[int, float]] = {}
    if path.exists():
        with open(path, newline="") as f:
            for row in csv.DictReader(f):
                if int(row["steps"]) == steps and int(row["batch_size"]) == batch_size:
                    out.setdefault(row["run"], {})[int(row["seed"])] = float(row["loss"])
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    print(f"machine: {platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads, device {dev.get_device('auto')}, fp32")
    start = time.perf_counter()

    base = pretrained.load()
    train_ids, val_ids = data.train_val_split(data.encode_corpus(data.stage_directions()))
    recipe = train.TrainConfig(max_steps=args.steps, batch_size=args.batch_size, lr=1e-3, min_lr=1e-4,
                               warmup_steps=args.steps // 10, eval_every=max(1, args.steps // 5),
                               eval_batches=4, precision="fp32")
    done = read(args.out, args.steps, args.batch_size)
    todo = [(seed, name) for seed in range(args.seeds) for name in ["base", *RUNS]
            if seed not in done.get(name, {})]

    def run(job):
        seed, name = job
        seeded = dataclasses.replace(recipe, seed=seed)
        loss = (train.evaluate(base, val_ids, seeded) if name == "base"
                else finetune(base, train_ids, val_ids, seeded, RUNS[name], seed))
        return {"steps": args.steps, "batch_size": args.batch_size, "seed": seed, "run": name,
                "loss": f"{loss:.6f}"}

    sweeps.append_rows(args.out, COLUMNS, todo, run, desc="fine-tunings")
    losses = read(args.out, args.steps, args.batch_size)
    seeds = range(args.seeds)

    print(f"\nfinal validation loss after {args.steps} steps of {args.batch_size} windows "
          f"(nats per byte; base = before fine-tuning)")
    print(f"{'':10s} " + " ".join(f"{'seed ' + str(s):>8s}" for s in seeds) + f" {'mean':>8s} {'sd':>7s}")
    for name in ["base", *RUNS]:
        values = [losses[name][s] for s in seeds]
        mean, sd = statistics.mean(values), statistics.stdev(values) if len(values) > 1 else 0.0
        print(f"{name:10s} " + " ".join(f"{v:8.3f}" for v in values) + f" {mean:8.3f} {sd:7.3f}")
    print("\ngain over the base model, as a share of q,v R=16's (the chapter's percentages)")
    for name in RUNS:
        base, top = losses["base"], losses["qv_r16"]
        shares = [(base[s] - losses[name][s]) / (base[s] - top[s]) for s in seeds]
        print(f"{name:10s} " + " ".join(f"{share:8.0%}" for share in shares))
    print("\nclaims per seed")
    held = {claim: [holds({n: v[s] for n, v in losses.items()}) for s in seeds]
            for claim, holds in CLAIMS.items()}
    for claim, flags in held.items():
        print(f"{claim:40s} " + " ".join(f"{'yes' if f else 'no':>5s}" for f in flags))
    always = [claim for claim, flags in held.items() if all(flags)]
    print(f"\nheld for every seed: {', '.join(always) or 'none'}")
    print(f"time: {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
