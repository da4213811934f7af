"""The chapter's training runs: a dense GPT against mixtures of experts on Shakespeare (chapter 07).

Every run is the same small GPT (bytes, 2 layers, ``D = 32``, a narrow MLP with ``F = 2 D``),
trained for the same steps on the same batches from three initialisations (seeds 0, 1, 2: a
mixture's loss varies more from seed to seed than the dense model's); only the feed-forward
layers differ::

    dense        one MLP of width F                              the baseline
    switch-E     E experts of width F, top-1 (E = 2, 4, 8, 16)   same FLOPs per token, E times the MLP
    switch-8-no-balance                                          balancing loss switched off
    top2-8       8 experts of width F / 2, top-2                 same active parameters as top-1

The models are small and trained on many tokens per parameter, so that parameters, not
training steps, limit them: the regime where a mixture of experts pays. (At 600 steps a
``D = 64`` model was limited by steps, and every MoE lost to the dense model: each expert sees
only its share of the tokens.)

``python -m course_lib.moe_runs train`` (``make moe-runs``) trains the runs missing from the CSV
and appends one row per run and seed (it resumes after an interruption); the chapter reads the
shipped ``course_lib/results/moe_runs.csv``, which records each run's seconds (22 minutes in
all on 2 CPU cores).

This is an experiment *about* the MoE layer, so it lives beside :mod:`course_lib.moe` rather
than in it, as :mod:`course_lib.scaling`'s sweep does for chapter 06: the layer depends on
nothing in :mod:`course_lib.model`, while this module builds GPTs, counts their FLOPs
(:mod:`course_lib.flops`) and trains them (:mod:`course_lib.train`).
"""

from __future__ import annotations

import csv
import dataclasses
import os
import time
from pathlib import Path

import torch

from . import data, flops
from .model import GPT, ModelConfig
from .moe import MoE, MoEConfig
from .sweeps import append_rows, parse_command_line
from .train import TrainConfig, train

__all__ = ["BASE", "TRAIN", "RUNS", "SEEDS", "RUNS_CSV", "measure_routing", "train_runs", "read_runs", "main"]

BASE = ModelConfig(vocab_size=256, context_length=64, d_model=32, n_layers=2, n_heads=4, d_ff=64)
TRAIN = TrainConfig(max_steps=1500, batch_size=32, lr=3e-3, min_lr=3e-4, warmup_steps=50, eval_every=150,
                    eval_batches=8, device="cpu", precision="fp32")
RUNS: dict[str, ModelConfig] = {
    "dense": BASE,
    **{f"switch-{E}": dataclasses.replace(BASE, moe=MoEConfig(n_experts=E)) for E in (2, 4, 8, 16)},
    "switch-8-no-balance": dataclasses.replace(BASE, moe=MoEConfig(n_experts=8, balance_coef=0.0)),
    "top2-8": dataclasses.replace(BASE, d_ff=BASE.d_ff // 2,
                                  moe=MoEConfig(n_experts=8, top_k=2, renormalize=True)),
}
SEEDS = (0, 1, 2)  # torch seeds of the models' initialisation; the batches are the same for all
RUNS_CSV = Path(__file__).resolve().parent / "results" / "moe_runs.csv"
COLUMNS = ("name", "seed", "n_experts", "top_k", "d_ff", "balance_coef", "params", "active_params",
           "flops_per_token", "loss", "dropped", "seconds", "curve", "load")


@torch.no_grad()
def measure_routing(model: GPT, ids: torch.Tensor, config: TrainConfig) -> tuple[torch.Tensor, float]:
    """``(load (L, E), dropped)`` over ``config.eval_batches`` validation batches (the ones
    :func:`course_lib.train.evaluate` uses): each MoE layer's share of the choices sent to each
    expert before capacity (a row sums to 1), and the fraction of choices dropped."""
    layers = [m for m in model.modules() if isinstance(m, MoE)]
    if not layers:
        raise ValueError("the model has no MoE layers (ModelConfig.moe is None)")
    load = torch.zeros(len(layers), layers[0].config.n_experts)
    dropped = total = 0
    generator = torch.Generator().manual_seed(config.seed)
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    for _ in range(config.eval_batches):
        x, _ = data.get_batch(ids, config.batch_size, model.config.context_length, generator=generator,
                              device=device)
        model(x)
        for i, layer in enumerate(layers):
            load[i] += layer.routing.load.cpu()
            dropped += layer.routing.dropped
            total += layer.routing.kept.numel()
    model.train(was_training)
    return load / load.sum(-1, keepdim=True), dropped / total


def _train_run(name: str, seed: int, train_ids: torch.Tensor, val_ids: torch.Tensor,
               config: TrainConfig) -> dict:
    model_config = RUNS[name]
    torch.manual_seed(seed)
    gpt = GPT(model_config)
    start = time.perf_counter()
    history = train(gpt, train_ids, val_ids, config, progress=False)
    seconds = time.perf_counter() - start
    count, moe = flops.param_count(model_config), model_config.moe
    load, dropped = measure_routing(gpt, val_ids, config) if moe else (torch.ones(1, 1), 0.0)
    return {
        "name": name, "seed": seed,
        "n_experts": moe.n_experts if moe else 1, "top_k": moe.top_k if moe else 1,
        "d_ff": model_config.ff_width, "balance_coef": moe.balance_coef if moe else 0.0,
        "params": count.total, "active_params": flops.active_params(model_config),
        "flops_per_token": flops.flops_per_token(model_config).total, "loss": round(history.val_loss[-1], 4),
        "dropped": round(dropped, 4), "seconds": round(seconds, 1),
        "curve": ";".join(f"{s}:{v:.4f}" for s, v in zip(history.val_steps, history.val_loss, strict=True)),
        "load": "|".join(",".join(f"{f:.4f}" for f in row) for row in load.tolist()),
    }


def read_runs(path: str | os.PathLike | None = None) -> dict[str, list[dict]]:
    """The rows of a runs CSV (default: the shipped one), grouped by run name (one row per
    seed), numbers as numbers: ``curve`` a list of ``(step, validation loss)``, ``load`` a list
    per MoE layer of each expert's share of the tokens."""
    with open(RUNS_CSV if path is None else path, newline="") as f:
        rows = list(csv.DictReader(f))
    for row in rows:
        for key in ("seed", "n_experts", "top_k", "d_ff", "params", "active_params", "flops_per_token"):
            row[key] = int(row[key])
        for key in ("balance_coef", "loss", "dropped", "seconds"):
            row[key] = float(row[key])
        row["curve"] = [(int(s), float(v)) for s, v in (p.split(":") for p in row["curve"].split(";"))]
        row["load"] = [[float(f) for f in layer.split(",")] for layer in row["load"].split("|")]
    grouped: dict[str, list[dict]] = {}
    for row in rows:
        grouped.setdefault(row["name"], []).append(row)
    return grouped


def train_runs(path: str | os.PathLike, names=tuple(RUNS), seeds=SEEDS, *, config: TrainConfig = TRAIN,
               max_chars: int | None = None, progress: bool = True) -> list[dict]:
    """Train every run in ``names`` with every seed in ``seeds`` not yet in the CSV at ``path``,
    appending a row after each; returns the rows trained by this call."""
    unknown = sorted(set(names) - set(RUNS))
    if unknown:
        raise ValueError(f"unknown runs {unknown}; choose from {sorted(RUNS)}")
    path = Path(path)
    done = {(n, r["seed"]) for n, rows in read_runs(path).items() for r in rows} if path.exists() else set()
    todo = [(n, s) for s in seeds for n in names if (n, s) not in done]
    if not todo:
        return []
    train_ids, val_ids = data.train_val_split(data.encode_corpus(data.shakespeare(max_chars)))
    return append_rows(path, COLUMNS, todo, lambda job: _train_run(*job, train_ids, val_ids, config),
                       desc="moe runs", progress=progress)


def main(argv: list[str] | None = None) -> int:
    """Command line: ``python -m course_lib.moe_runs train [--out PATH] [--quick] [--threads N]``."""
    args = parse_command_line("python -m course_lib.moe_runs", "train",
                              "train the chapter's dense and MoE runs; write (or complete) the CSV", RUNS_CSV,
                              "moe_runs_quick.csv", "20 steps per run on 100k characters: a smoke test", argv)
    config = dataclasses.replace(TRAIN, max_steps=20, warmup_steps=2, eval_every=10, eval_batches=2) \
        if args.quick else TRAIN
    rows = train_runs(args.out, seeds=SEEDS[:1] if args.quick else SEEDS, config=config,
                      max_chars=100_000 if args.quick else None)
    print(f"{args.out}: trained {len(rows)} runs in {sum(r['seconds'] for r in rows):.0f} s; "
          f"{sum(map(len, read_runs(args.out).values()))} runs in the file")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
