"""Benchmark course_lib's GPT against HuggingFace's GPT2LMHeadModel: training and decoding (chapter 03).

Run from the repository root: ``python benchmarks/bench_model.py`` (``--device``, ``--threads``,
``--repeats``, ``--vocab-size`` to change the work; ``--quick`` for a smoke run of under a
minute on a CPU). Both models are built offline from one ``GPT2Config`` (dropout 0, tanh GELU,
tied head); course_lib's holds HF's weights via ``from_hf_gpt2``, and both are checked to give
the same loss on the same batch before anything is timed. Prints tokens/s, seconds and ratios:

1. the machine's matmul peak (square n x n ``F.linear``, ``2 n^3`` FLOPs, best n up to 2048
   on CPU, 8192 on CUDA) in fp32 and bf16, and the FLOPs of one training step (counted by
   ``FlopCounterMode``), for MFU = achieved FLOP/s / measured peak;
2. a training step (forward + backward + AdamW from ``course_lib.train.make_optimizer``, the
   same hyper-parameters for both) in fp32 at "L4 H4 D128 S64 B12" and "L6 H6 D384 S256 B8"
   (L layers, H heads, D d_model, S sequence length, B batch): course_lib with
   ``attn_impl="sdpa"`` (target: tokens/s >= HF's, ratio >= 1.0) and ``"naive"``, HF with its
   default attention implementation. On CUDA the default sizes are "L6 H6 D384 S256 B8" and
   GPT-2 small, "L12 H12 D768 S1024 B8";
3. the same step under bf16 autocast (``course_lib.device.autocast``; HF under the same
   ``torch.autocast``): ratio to HF bf16 and to our fp32. Skipped by default where the bf16
   matmul is slow (a CPU without AVX512-BF16/AMX) and a step would take long;
4. decoding 256 new tokens greedily from a 16-token prompt (batch 1, the larger model,
   ``context_length`` = prompt + 256) with ``generate(use_cache=True)`` vs ``use_cache=False``;
   the two must give identical tokens.

Training timings are medians of ``--repeats`` timed runs of ``--steps`` steps after
``--warmup`` runs; the models' runs are interleaved (the order rotates each repeat) so that
machine noise hits all of them. Ratios here are of tokens/s (higher is better), the inverse of
the time ratios in the other benchmarks; decoding gives times and recompute/cache.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import platform
import statistics
import time

import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from course_lib.device import autocast, get_device
from course_lib.generation import generate
from course_lib.model import GPT, ModelConfig, from_hf_gpt2
from course_lib.train import TrainConfig, make_optimizer

SIZES = ("L4 H4 D128 S64 B12", "L6 H6 D384 S256 B8")
CUDA_SIZES = ("L6 H6 D384 S256 B8", "L12 H12 D768 S1024 B8")  # the second is GPT-2 small
QUICK_SIZES = ("L2 H2 D64 S32 B4", "L2 H4 D128 S64 B4")
GPT2_VOCAB = 50257  # the real GPT-2 vocabulary: the (V, D) head is most of the FLOPs at these widths


def parse_size(size: str) -> dict[str, int]:
    """``"L4 H4 D128 S64 B12"`` -> ``{"L": 4, "H": 4, "D": 128, "S": 64, "B": 12}``."""
    parts = {p[0]: int(p[1:]) for p in size.split()}
    if sorted(parts) != sorted("LHDSB"):
        raise ValueError(f"size must name L, H, D, S and B once each, got {size!r}")
    return parts


def sync(device: torch.device) -> None:
    """Wait for queued CUDA work, so that a wall-clock time covers the kernels themselves."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def interleaved(fns: dict, warmup: int, repeats: int, device: torch.device) -> dict[str, float]:
    """Median seconds of each ``fn()``; repeat r runs them in an order rotated by r."""
    names = list(fns)
    for _ in range(warmup):
        for name in names:
            fns[name]()
    times: dict[str, list[float]] = {name: [] for name in names}
    for r in range(repeats):
        for name in names[r % len(names):] + names[:r % len(names)]:
            sync(device)
            t0 = time.perf_counter()
            fns[name]()
            sync(device)
            times[name].append(time.perf_counter() - t0)
    return {name: statistics.median(ts) for name, ts in times.items()}


def matmul_peak(device: torch.device, dtype: torch.dtype, n_max: int, budget_s: float = 1.0):
    """(FLOP/s, n): the best rate of ``F.linear(a, b)`` (``a @ b.T``, what ``nn.Linear`` runs)
    on n x n inputs, best of 3 timings at each n, n doubling from 256 up to ``n_max`` and
    stopping early when the next size (8x the work) would take over ``budget_s`` a product.
    Best, not median: a peak, and noise from other work only ever slows a run down (on a CPU
    n = 1024 often beats 2048, whose operands fall out of cache). ``F.linear`` rather than
    ``a @ b``: on a CPU without native bf16, bf16 ``a @ b`` runs ~100x below fp32 but
    ``F.linear`` (oneDNN) ~8x, and the models' matmuls are linears."""
    inner = 10 if device.type == "cuda" else 1  # back-to-back products per timing on a GPU
    best, best_n, n = 0.0, 0, 256
    while True:
        a, b = (torch.randn(n, n, device=device, dtype=dtype) for _ in range(2))
        F.linear(a, b)  # warm-up
        runs = []
        for _ in range(3):
            sync(device)
            t0 = time.perf_counter()
            for _ in range(inner):
                F.linear(a, b)
            sync(device)
            runs.append((time.perf_counter() - t0) / inner)
        seconds = min(runs)
        if 2 * n**3 / seconds > best:
            best, best_n = 2 * n**3 / seconds, n
        if n >= n_max or 8 * seconds > budget_s:
            return best, best_n
        n *= 2


def build_models(size: dict[str, int], vocab_size: int, device: torch.device):
    """(HF GPT2LMHeadModel, ours sdpa, ours naive), all with the same weights, in train mode."""
    from transformers import GPT2Config, GPT2LMHeadModel

    special = vocab_size - 1  # GPT-2's <|endoftext|> is its last id; keeps HF's config check quiet
    hf_config = GPT2Config(vocab_size=vocab_size, n_positions=size["S"], n_embd=size["D"],
                           n_layer=size["L"], n_head=size["H"], resid_pdrop=0.0, embd_pdrop=0.0,
                           attn_pdrop=0.0, bos_token_id=special, eos_token_id=special)
    torch.manual_seed(0)
    hf = GPT2LMHeadModel(hf_config)  # HF's GPT-2 init, on the CPU
    naive = from_hf_gpt2(hf)  # attn_impl="naive" (ModelConfig's default)
    sdpa = GPT(dataclasses.replace(naive.config, attn_impl="sdpa"))
    sdpa.load_state_dict(naive.state_dict())
    assert sdpa.num_params() == sum(p.numel() for p in hf.parameters())
    return tuple(m.to(device).train() for m in (hf, sdpa, naive))


def shifted_targets(x: torch.Tensor) -> torch.Tensor:
    """Next-token targets for ``x``, -100 (ignored) at the last position: the same tokens that
    HF's loss uses when given ``labels=x`` (it shifts inside the model)."""
    return torch.cat([x[:, 1:], torch.full_like(x[:, :1], -100)], dim=1)


def ours_loss(model, x, y):
    return model(x, y)[1]


def hf_loss(model, x, y):
    return model(input_ids=x, labels=x, use_cache=False).loss  # no KV cache while training


def make_step(model, loss_fn, x, y, precision: str, steps: int, device: torch.device):
    """``steps`` training steps: forward (under autocast for bf16), backward, AdamW, zero_grad."""
    optimizer = make_optimizer(model, TrainConfig())  # AdamW lr 1e-3, betas (0.9, 0.95), wd 0.1

    def run():
        for _ in range(steps):
            with autocast(device, precision):
                loss = loss_fn(model, x, y)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

    return run


def step_flops(model, x, y) -> int:
    """FLOPs of one forward + backward of ``model`` (course_lib, ``attn_impl="naive"``) counted
    by ``FlopCounterMode``: matmuls only (linears, the head, QK^T and weights @ V over the full
    S x S, as the usual 6 N T + 12 L S D T estimate); norms, GELU, softmax, cross-entropy and
    AdamW are not counted. The naive path is counted because torch's CPU fused attention
    kernel has no FLOP formula (it would count 0); the model's FLOPs are the same either way."""
    with FlopCounterMode(display=False) as counter:
        ours_loss(model, x, y).backward()
    model.zero_grad(set_to_none=True)
    return counter.get_total_flops()


def measure(models: dict, precision: str, x, y, flops: int, peak: float, device, args) -> tuple[dict, dict]:
    """Tokens/s and MFU of each ``name: (model, loss_fn)``'s interleaved training steps."""
    fns = {k: make_step(m, loss, x, y, precision, args.steps, device) for k, (m, loss) in models.items()}
    sec = interleaved(fns, args.warmup, args.repeats, device)
    tokens = args.steps * x.numel()  # (B, S) per step
    return ({k: tokens / s for k, s in sec.items()},
            {k: flops * args.steps / s / peak for k, s in sec.items()})


def training(sizes, vocab_size: int, device: torch.device, args, peaks) -> list[dict]:
    """Sections 2 (fp32) and 3 (bf16); returns one row per size for the summary table."""
    rows = []
    for name in sizes:
        size = parse_size(name)
        hf, sdpa, naive = build_models(size, vocab_size, device)
        gen = torch.Generator().manual_seed(0)
        x = torch.randint(vocab_size, (size["B"], size["S"]), generator=gen).to(device)
        y = shifted_targets(x)
        with torch.no_grad():  # apples to apples: the same function of the same weights
            ref = hf_loss(hf, x, y).item()
            for model in (sdpa, naive):
                got = ours_loss(model, x, y).item()
                assert abs(got - ref) < 1e-4 * max(1.0, abs(ref)), f"{name}: loss {got} vs HF {ref}"
        flops = step_flops(naive, x, y)
        L, S, D = size["L"], size["S"], size["D"]
        # cross-check: N = non-embedding params + the (V, D) head (tied, but still a matmul)
        estimate = (6 * (naive.num_params(non_embedding=True) + vocab_size * D) * size["B"] * S
                    + 12 * L * S * D * size["B"] * S)
        print(f"\n{name}: loss {ref:.4f} (HF, ours sdpa and naive agree), "
              f"{naive.num_params() / 1e6:.2f} M params ({naive.num_params(non_embedding=True) / 1e6:.2f} M "
              f"non-embedding); {flops / 1e9:.4g} GFLOP per step (FlopCounterMode), "
              f"6 N T + 12 L S D T estimate {estimate / 1e9:.4g}; "
              f"HF attention: {hf.config._attn_implementation}")
        row = {"size": name, "flops": flops, "attn": hf.config._attn_implementation}

        # 2. fp32
        models = {"hf": (hf, hf_loss), "sdpa": (sdpa, ours_loss), "naive": (naive, ours_loss)}
        tps, mfu = row["fp32"] = measure(models, "fp32", x, y, flops, peaks["fp32"][0], device, args)
        print(f"  fp32  HF {tps['hf']:9.0f} tok/s ({mfu['hf']:6.1%} MFU)   "
              f"ours sdpa {tps['sdpa']:9.0f} ({mfu['sdpa']:6.1%}) ratio {tps['sdpa'] / tps['hf']:5.2f}   "
              f"ours naive {tps['naive']:9.0f} ({mfu['naive']:6.1%}) ratio {tps['naive'] / tps['hf']:5.2f}")

        # 3. bf16 autocast: sdpa only (the fast path), HF under the same torch.autocast
        est = flops / peaks["bf16"][0]  # seconds per step at the measured bf16 matmul rate
        fast_bf16 = peaks["bf16"][0] >= 0.25 * peaks["fp32"][0]
        if args.bf16 == "off":
            print("  bf16  skipped (--bf16 off)")
            row["bf16"] = None
        elif args.bf16 == "auto" and not fast_bf16 and est > 2.0:
            print(f"  bf16  skipped: the bf16 matmul runs at {peaks['bf16'][0] / 1e9:.2f} GFLOP/s here "
                  f"(fp32 {peaks['fp32'][0] / 1e9:.1f}), ~{est:.0f} s a step; --bf16 on to force")
            row["bf16"] = None
        else:
            del models["naive"]  # bf16: the fast path only
            tps16, mfu16 = row["bf16"] = measure(models, "bf16", x, y, flops, peaks["bf16"][0], device, args)
            print(f"  bf16  HF {tps16['hf']:9.0f} tok/s ({mfu16['hf']:6.1%} MFU)   "
                  f"ours sdpa {tps16['sdpa']:9.0f} ({mfu16['sdpa']:6.1%}) "
                  f"ratio {tps16['sdpa'] / tps16['hf']:5.2f}   "
                  f"ours bf16/fp32 {tps16['sdpa'] / tps['sdpa']:5.2f}")
        rows.append(row)
        del hf, sdpa, naive, models
    return rows


def decoding(size_name: str, vocab_size: int, device: torch.device, args) -> dict:
    """Section 4: greedy decoding with and without the KV cache; asserts identical tokens."""
    size = parse_size(size_name)
    config = ModelConfig(vocab_size=vocab_size, context_length=args.prompt_len + args.new_tokens,
                         d_model=size["D"], n_layers=size["L"], n_heads=size["H"], attn_impl="sdpa")
    torch.manual_seed(0)
    model = GPT(config).to(device).eval()
    gen = torch.Generator().manual_seed(1)
    prompt = torch.randint(vocab_size, (1, args.prompt_len), generator=gen).to(device)
    outs = {}

    def run(use_cache: bool, n: int):
        def fn():
            outs[use_cache] = generate(model, prompt, n, greedy=True, use_cache=use_cache)
        return fn

    for use_cache in (True, False):  # warm-up on a few tokens only (recomputing is slow)
        run(use_cache, 8)()
    sec = interleaved({"cache": run(True, args.new_tokens), "recompute": run(False, args.new_tokens)},
                      0, args.gen_repeats, device)
    assert torch.equal(outs[True], outs[False]), "use_cache=True and False gave different tokens"
    assert outs[True].shape[1] == args.prompt_len + args.new_tokens
    print(f"\n4. decoding {args.new_tokens} tokens greedily, {size_name.rsplit(' ', 2)[0]}, vocab "
          f"{vocab_size}, prompt {args.prompt_len}, batch 1, sdpa (s, median of {args.gen_repeats})\n"
          f"   KV cache {sec['cache']:.2f}   recompute prefix {sec['recompute']:.2f}   "
          f"recompute/cache {sec['recompute'] / sec['cache']:.1f}x   (tokens identical)")
    return sec


def summary(rows: list[dict], gen: dict, gen_size: str, vocab_size: int, args) -> None:
    """Markdown tables to paste into benchmarks/README.md."""
    print(f"\ntable for benchmarks/README.md (tokens/s, vocab {vocab_size}, HF attention "
          f"{rows[0]['attn']}; ratio = ours / HF tokens/s; MFU against the measured matmul peak):\n")
    print("| config | precision | HF tok/s (MFU) | ours sdpa tok/s (MFU) | ratio (target >= 1.0 in fp32) "
          "| ours naive tok/s | ratio | ours bf16 / fp32 |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for row in rows:
        for precision in ("fp32", "bf16"):
            if row[precision] is None:
                print(f"| {row['size']} | {precision} | skipped | | | | | |")
                continue
            tps, mfu = row[precision]
            if precision == "fp32":
                rest = f"{tps['naive']:.0f} | {tps['naive'] / tps['hf']:.2f} | "
            else:
                rest = f" | | {tps['sdpa'] / row['fp32'][0]['sdpa']:.2f}"
            print(f"| {row['size']} | {precision} | {tps['hf']:.0f} ({mfu['hf']:.1%}) | "
                  f"{tps['sdpa']:.0f} ({mfu['sdpa']:.1%}) | {tps['sdpa'] / tps['hf']:.2f} | {rest} |")
    print(f"\n| decoding {args.new_tokens} tokens, {gen_size.rsplit(' ', 2)[0]}, batch 1 | KV cache s | "
          "recompute s | recompute/cache |")
    print("| --- | --- | --- | --- |")
    print(f"| greedy, prompt {args.prompt_len} | {gen['cache']:.2f} | {gen['recompute']:.2f} | "
          f"{gen['recompute'] / gen['cache']:.1f}x |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="auto", help="auto | cpu | cuda[:N] (course_lib.device)")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch CPU threads (default: torch's; 1 with --quick)")
    parser.add_argument("--sizes", nargs="+", default=None,
                        help=f"configs to train, each quoted (default: {', '.join(SIZES)})")
    parser.add_argument("--vocab-size", type=int, default=None,
                        help=f"vocabulary (default {GPT2_VOCAB}, GPT-2's; 1024 with --quick)")
    parser.add_argument("--warmup", type=int, default=None, help="untimed runs per model (default 2)")
    parser.add_argument("--repeats", type=int, default=None, help="timed runs per model (default 5)")
    parser.add_argument("--steps", type=int, default=None,
                        help="training steps per timed run (default 1 on CPU, 10 on CUDA)")
    parser.add_argument("--bf16", choices=("auto", "on", "off"), default="auto",
                        help="bf16 section: auto skips it where bf16 matmuls are slow and a step is long")
    parser.add_argument("--new-tokens", type=int, default=None, help="decoded tokens (default 256)")
    parser.add_argument("--prompt-len", type=int, default=16)
    parser.add_argument("--gen-repeats", type=int, default=None, help="timed decoding runs (default 3)")
    parser.add_argument("--quick", action="store_true", help="smoke run: small sizes, few steps (< 1 min)")
    args = parser.parse_args()

    device = get_device(args.device)
    quick = args.quick
    # --quick is a smoke run: one thread keeps it quick on a busy machine, where two OpenMP
    # threads sharing two loaded cores spin-wait on each other (~10-100x slower small ops).
    threads = args.threads or (1 if quick else None)
    if threads is not None:
        torch.set_num_threads(threads)
    sizes = args.sizes or (QUICK_SIZES if quick else CUDA_SIZES if device.type == "cuda" else SIZES)
    vocab_size = args.vocab_size or (1024 if quick else GPT2_VOCAB)
    defaults = {"warmup": 1 if quick else 2, "repeats": 2 if quick else 5,
                "steps": 1 if quick or device.type != "cuda" else 10,
                "new_tokens": 32 if quick else 256, "gen_repeats": 1 if quick else 3}
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)

    import transformers

    transformers.logging.set_verbosity_error()
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, {platform.machine()}, "
          f"{os.cpu_count()} CPUs, {torch.get_num_threads()} threads, device {device} ({where})")

    n_max = (2048 if quick else 8192) if device.type == "cuda" else (1024 if quick else 2048)
    peaks = {"fp32": matmul_peak(device, torch.float32, n_max),
             "bf16": matmul_peak(device, torch.bfloat16, n_max)}
    print(f"\n1. matmul peak (F.linear, n x n by n x n, 2 n^3 FLOPs, best n <= {n_max}): "
          + "   ".join(f"{k} {v[0] / 1e9:.1f} GFLOP/s (n={v[1]})" for k, v in peaks.items())
          + ("" if device.type != "cuda" else f"; TF32 {torch.backends.cuda.matmul.allow_tf32}"))

    print(f"\n2./3. training step (forward + backward + AdamW), vocab {vocab_size}, tokens/s (median of "
          f"{args.repeats} runs of {args.steps} step(s) after {args.warmup}; ratio = ours / HF tokens/s, "
          f"target >= 1.0 for sdpa in fp32; MFU = FLOPs per step / time / matmul peak)")
    rows = training(sizes, vocab_size, device, args, peaks)
    gen = decoding(sizes[-1], vocab_size, device, args)
    summary(rows, gen, sizes[-1], vocab_size, args)


if __name__ == "__main__":
    main()
