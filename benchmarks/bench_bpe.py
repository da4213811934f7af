"""Benchmark course_lib.bpe against HuggingFace tokenizers and tiktoken on Shakespeare.

Run from the repository root: ``python benchmarks/bench_bpe.py`` (``--vocab-size``,
``--chars`` to change the work). Prints seconds, MB/s and ratios; targets from the design:

1. training to vocab 4096: course_lib (pure Python) vs ``tokenizers`` BpeTrainer with
   the same GPT-4 split pattern + byte-level: ratio <= 25;
2. pure-Python encode of the corpus: >= 1 MB/s, cold cache (new tokenizer) and warm;
3. ``to_tiktoken()`` of the trained tokenizer vs tiktoken's own GPT-2 (r50k_base) on the
   same text: within 1.5x of GPT-2's time (r50k needs ``python -m course_lib.bpe
   fetch-ranks`` once; skipped with a note otherwise).

Each timing is the best of ``--repeats`` runs (training: one run each).
"""

from __future__ import annotations

import argparse
import os
import platform
import time

from course_lib import bpe
from course_lib.data import shakespeare


def best_of(fn, repeats):
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return min(times), out


def train_hf(text: str, vocab_size: int, n_docs: int = 100):
    """HF BPE with the same split pattern, fed ``n_docs`` pieces cut at line ends.

    One 5 MB string runs single-threaded (~2x slower here); 100 pieces let it use every
    core (1000 are slower again). Cutting at line ends barely changes the chunks.
    """
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers, trainers

    lines = text.splitlines(keepends=True)
    step = len(lines) // n_docs + 1
    docs = ["".join(lines[i : i + step]) for i in range(0, len(lines), step)]

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(bpe.GPT4_SPLIT_PATTERN), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(docs, trainer=trainer)
    return tok


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocab-size", type=int, default=4096)
    parser.add_argument("--chars", type=int, default=None, help="corpus prefix (default: all)")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    text = shakespeare(args.chars)
    mb = len(text.encode("utf-8")) / 1e6
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores")
    print(f"corpus: {mb:.2f} MB, vocab_size={args.vocab_size}\n")

    # 1. training
    t_ours, tok = best_of(lambda: bpe.train(text, args.vocab_size), 1)
    t_hf, hf = best_of(lambda: train_hf(text, args.vocab_size), 1)
    print("training")
    print(f"  course_lib.bpe.train   {t_ours:7.2f} s")
    print(f"  tokenizers BpeTrainer  {t_hf:7.2f} s   (vocab {hf.get_vocab_size()})")
    print(f"  ratio                  {t_ours / t_hf:7.1f} x   (target <= 25)\n")

    # 2. pure-Python encode
    def cold():
        fresh = bpe.Tokenizer(tok.merges, tok.pattern, tok.special_tokens)
        return fresh.encode(text)

    t_cold, ids = best_of(cold, args.repeats)
    t_warm, _ = best_of(lambda: tok.encode(text), args.repeats)  # cache filled by now
    print("pure-Python encode")
    print(f"  cold cache  {t_cold:6.2f} s  {mb / t_cold:6.2f} MB/s   (target >= 1)")
    print(f"  warm cache  {t_warm:6.2f} s  {mb / t_warm:6.2f} MB/s")
    print(f"  {len(ids)} tokens, {len(text) / len(ids):.2f} chars/token\n")

    # 3. exported tiktoken encoding vs GPT-2's
    enc = tok.to_tiktoken()
    t_exp, exp_ids = best_of(lambda: enc.encode_ordinary(text), args.repeats)
    assert exp_ids == ids, "exported tiktoken encoding disagrees with the Python one"
    print("tiktoken (Rust) encode")
    print(f"  course_bpe (4096)  {t_exp:6.2f} s  {mb / t_exp:6.2f} MB/s")
    try:
        gpt2 = bpe.tiktoken_encoding("r50k_base")
    except FileNotFoundError as e:
        print(f"  r50k_base skipped: {e}")
        return
    t_gpt2, _ = best_of(lambda: gpt2.encode_ordinary(text), args.repeats)
    print(f"  r50k_base (GPT-2)  {t_gpt2:6.2f} s  {mb / t_gpt2:6.2f} MB/s")
    print(f"  ratio ours/GPT-2   {t_exp / t_gpt2:6.2f} x   (target <= 1.5)")


if __name__ == "__main__":
    main()
