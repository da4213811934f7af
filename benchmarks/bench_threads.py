"""How torch's CPU threads fare on an idle and on a busy machine: the chapters' training steps under
each thread setting, with 0, 1 and 3 CPU burners per core.

    python benchmarks/bench_threads.py [--steps-scale 1.0] [--loads 0 1 3] [--settings ...]

Each (setting, load) runs in a fresh process, since OpenMP reads its settings when torch loads.
Settings: ``spin`` (OpenMP's default: threads spin a while before they sleep), ``passive``
(``OMP_WAIT_POLICY=PASSIVE``: they sleep at once), ``one`` (a single thread, nothing to wait for)
and ``course`` (what ``course_tools.config.kernel_env`` gives a kernel). The work is the
training of chapters 03 (a 2-layer character GPT, d_model 128, batches of 16 x 64) and 04 (a
6-layer GPT, d_model 64, batches of 3 x 64), a few dozen steps each. Prints seconds per workload
and each setting's slowdown under load against its own idle time and against the fastest idle one.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time

SETTINGS = {
    "spin": {},
    "passive": {"OMP_WAIT_POLICY": "PASSIVE"},
    "one": {"OMP_NUM_THREADS": "1"},
    "spin1k": {"GOMP_SPINCOUNT": "1000"},
    "spin10k": {"GOMP_SPINCOUNT": "10000"},
    "spin30k": {"GOMP_SPINCOUNT": "30000"},
}

WORK = r"""
import json, sys, time
import torch
from course_lib import data, model, train
steps_scale = float(sys.argv[1])
text = data.shakespeare(max_chars=300_000)
train_ids, val_ids = data.train_val_split(data.encode_corpus(text), val_fraction=0.1)
out = {"threads": torch.get_num_threads()}

def run(name, config, steps, batch_size):
    torch.manual_seed(0)
    gpt = model.GPT(config)
    cfg = train.TrainConfig(max_steps=steps, batch_size=batch_size, lr=1e-3, warmup_steps=0,
                            eval_every=steps, eval_batches=1)
    start = time.perf_counter()
    train.train(gpt, train_ids, val_ids, cfg, progress=False)
    out[name] = time.perf_counter() - start

run("03", model.ModelConfig(vocab_size=256, context_length=64, d_model=128, n_layers=2, n_heads=4,
                            positional="rope", norm="rmsnorm", mlp="swiglu", attn_impl="sdpa"),
    max(1, int(40 * steps_scale)), 16)
run("04", model.ModelConfig(vocab_size=256, context_length=64, d_model=64, n_layers=6, n_heads=4,
                            norm_position="post"), max(1, int(80 * steps_scale)), 3)
print(json.dumps(out))
"""


def course_env() -> dict[str, str]:
    from course_tools import config

    env = config.kernel_env()
    return {k: env[k] for k in ("OMP_WAIT_POLICY", "OMP_NUM_THREADS", "GOMP_SPINCOUNT") if k in env}


def measure(env_extra: dict[str, str], burners: int, steps_scale: float) -> dict:
    env = {k: v for k, v in os.environ.items()
           if k not in ("OMP_WAIT_POLICY", "OMP_NUM_THREADS", "GOMP_SPINCOUNT", "MKL_NUM_THREADS")}
    env.update(env_extra)
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(burners)]
    try:
        time.sleep(0.2 if hogs else 0)
        done = subprocess.run([sys.executable, "-c", WORK, str(steps_scale)], env=env, check=True,
                              capture_output=True, text=True)
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps-scale", type=float, default=1.0)
    parser.add_argument("--loads", type=int, nargs="+", default=[0, 1, 3], help="burners per core")
    parser.add_argument("--settings", nargs="+", default=[*SETTINGS, "course"])
    args = parser.parse_args()
    cores = os.cpu_count() or 1
    print(f"{platform.processor() or platform.machine()}, {cores} CPUs, Python {platform.python_version()}")
    results = {}
    for load in args.loads:
        for name in args.settings:
            extra = course_env() if name == "course" else SETTINGS[name]
            r = measure(extra, load * cores, args.steps_scale)
            results[name, load] = r
            print(f"{name:8s} {load} burner(s)/core ({r['threads']} threads): "
                  + ", ".join(f"ch{k} {v:6.2f} s" for k, v in r.items() if k != "threads"), flush=True)
    for chapter in ("03", "04"):
        best_idle = min(r[chapter] for (name, load), r in results.items() if load == 0)
        print(f"\nchapter {chapter}: seconds (x its own idle time, x the fastest idle setting)")
        for name in args.settings:
            cells = []
            for load in args.loads:
                r = results[name, load][chapter]
                idle = results.get((name, 0), {}).get(chapter, r)
                cells.append(f"{load}/core {r:6.2f} s ({r / idle:4.1f}x, {r / best_idle:4.1f}x)")
            print(f"  {name:8s} " + "  ".join(cells))


if __name__ == "__main__":
    main()
