"""Small character-level GPTs trained on Shakespeare, shipped with the library (chapters 03, 08, 09).

Chapter 03 loads ``chapter03_char``, the chapter's kind of model (RoPE, RMSNorm, SwiGLU) made larger
and trained longer on the chapter's own text and split (:data:`CHAPTER03_CHAR`: 0.83 M parameters,
4 blocks, a context of 128 bytes, the first million characters), to compare a GPT fairly with
count n-gram models; its file also records the validation loss of the same recipe run with two
other seeds, so that the chapter can say how much of a difference is luck. Later chapters start
from ``shakespeare_char``, a model that already writes something like Shakespeare, instead of
training one first: 0.84 M parameters, a context of 128 bytes, a validation loss of 1.54 nats
per byte (a uniform guess is ln 256 = 5.55). :func:`load` reads them from
``course_lib/checkpoints/``; :func:`build` trains one again from scratch with its fixed recipe
(:data:`SHAKESPEARE_CHAR` in about 7 minutes on 2 quiet CPU cores, :data:`CHAPTER03_CHAR` in
about 15 minutes a seed, three seeds; ``make checkpoint`` builds both, ``python -m
course_lib.pretrained build --name NAME [--max-steps N] [--out PATH]`` one)::

    shakespeare() --encode_corpus--> bytes (N,) --train_val_split--> train (0.9 N), val (0.1 N)
    GPT(spec.model) --train(spec.train)--> fp32 weights --fp16--> shakespeare_char.pt (< 2 MB)

The file holds the weights in fp16 (half the bytes; :func:`load` casts them back to fp32), the
model and train configs, the corpus settings, and two validation losses of the weights *as
stored*: ``val_loss`` from :func:`course_lib.train.evaluate` (fixed batches of fresh windows) and
``val_loss_all`` from :func:`course_lib.train.evaluate_all` (every validation byte, predicted
through a sliding window from at least three quarters of the context), so anyone can check them.
:func:`load_info` returns all of that but the weights.

>>> SHAKESPEARE_CHAR.model.vocab_size, SHAKESPEARE_CHAR.model.context_length
(256, 128)
>>> model = load()                  # eval mode, fp32
>>> model.config == SHAKESPEARE_CHAR.model, model.training
(True, False)

Left out: larger models and BPE vocabularies (a GPT-2 comes from :func:`course_lib.model.from_hf_gpt2`),
the optimizer state (the file is for using the model, not for resuming its training), the other
seeds' weights (their losses are enough to measure the spread), and downloading checkpoints:
these ship inside the package.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import os
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from . import data
from .model import GPT, ModelConfig
from .train import TrainConfig, evaluate, evaluate_all, train

__all__ = ["Spec", "SHAKESPEARE_CHAR", "CHAPTER03_CHAR", "SPECS", "CHECKPOINT_DIR", "build", "load",
           "load_info", "loss_all", "main"]

CHECKPOINT_DIR = Path(__file__).parent / "checkpoints"
_FORMAT = 1  # bump when the file's layout changes


@dataclass(frozen=True)
class Spec:
    """Everything that fixes a shipped checkpoint: its name, the model's shape, the training
    recipe (with its seed) and the text: ``data.shakespeare(max_chars)`` as UTF-8 bytes, the
    last ``val_fraction`` of it held out for validation."""

    name: str
    model: ModelConfig
    train: TrainConfig
    max_chars: int | None = None  # None = all ~5.3 million characters
    val_fraction: float = 0.1
    other_seeds: tuple[int, ...] = ()  # the recipe run again with these seeds: their losses are recorded

    def corpus(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(train_ids, val_ids)``, bytes, exactly as :func:`build` used them."""
        ids = data.encode_corpus(data.shakespeare(self.max_chars))  # (N,), vocabulary 256
        return data.train_val_split(ids, self.val_fraction)


SHAKESPEARE_CHAR = Spec(
    name="shakespeare_char",
    # GPT-2's layout at 0.84 M parameters (1.7 MB in fp16); sdpa is the faster attention on a CPU
    model=ModelConfig(vocab_size=256, context_length=128, d_model=128, n_layers=4, n_heads=4,
                      attn_impl="sdpa"),
    # small batches, many steps: on a 10-minute budget (4.1 M bytes seen) this beat B = 16 and 32
    train=TrainConfig(max_steps=4000, batch_size=8, lr=4e-3, min_lr=1e-4, warmup_steps=200,
                      eval_every=1000, eval_batches=32, seed=0, device="auto", precision="fp32"),
)
# Chapter 03's kind of GPT (RoPE, RMSNorm, SwiGLU) on chapter 03's text and split (the first million
# characters): twice the blocks and the context of the chapter's own run, dropout against the
# repeats of a small text, and 8 times its steps; 0.83 M parameters, 6.1 M tokens seen
CHAPTER03_CHAR = Spec(
    name="chapter03_char",
    model=ModelConfig(vocab_size=256, context_length=128, d_model=128, n_layers=4, n_heads=4, dropout=0.1,
                      positional="rope", norm="rmsnorm", mlp="swiglu", attn_impl="sdpa"),
    train=TrainConfig(max_steps=3000, batch_size=16, lr=3e-3, min_lr=3e-4, warmup_steps=100,
                      eval_every=250, eval_batches=8, seed=0, device="auto", precision="fp32"),
    max_chars=1_000_000,
    other_seeds=(1, 2),
)
SPECS = {spec.name: spec for spec in (SHAKESPEARE_CHAR, CHAPTER03_CHAR)}


def _resolve(name: str | os.PathLike) -> Path:
    """The file for a shipped checkpoint's name, or ``name`` itself if it is an existing file."""
    if isinstance(name, str) and name in SPECS:
        path = CHECKPOINT_DIR / f"{name}.pt"
        if not path.is_file():
            raise FileNotFoundError(f"the checkpoint {name!r} is missing at {path}; build it with "
                                    f"`make checkpoint` (python -m course_lib.pretrained build)")
        return path
    if os.path.isfile(name):
        return Path(name)
    raise ValueError(f"unknown checkpoint {str(name)!r}: not one of the shipped {sorted(SPECS)} "
                     f"and not an existing file written by build()")


def _read(name: str | os.PathLike) -> dict:
    ckpt = torch.load(_resolve(name), map_location="cpu", weights_only=True)
    if ckpt.get("format") != _FORMAT:
        raise ValueError(f"{name!r} is not a course_lib.pretrained checkpoint of format {_FORMAT} "
                         f"(got format {ckpt.get('format')!r}); rebuild it with build()")
    return ckpt


def load(name: str | os.PathLike = "shakespeare_char") -> GPT:
    """The trained :class:`course_lib.model.GPT` named ``name`` (or in the file ``name`` that
    :func:`build` wrote), on the CPU, in fp32 and in eval mode."""
    ckpt = _read(name)
    model = GPT(ModelConfig(**ckpt["model_config"]))
    model.load_state_dict(ckpt["state_dict"])  # fp16 tensors copied into the fp32 parameters
    return model.eval()


def load_info(name: str | os.PathLike = "shakespeare_char") -> dict:
    """What the checkpoint says about itself, without the weights: ``name``, ``model_config``,
    ``train_config`` (dicts), ``corpus`` (``max_chars``, ``val_fraction``, ``tokenizer``),
    ``val_loss`` and ``val_loss_all`` (nats per byte, of the stored weights; see :func:`loss_all`),
    ``train_loss_all`` (the same on the first ``len(val)`` training bytes),
    ``other_seeds`` (seed -> ``val_loss_all`` of the recipe run with it), ``steps``, ``seconds``,
    ``torch``."""
    return {k: v for k, v in _read(name).items() if k != "state_dict"}


def _train(spec: Spec, config: TrainConfig, train_ids, val_ids, progress: bool):
    """One run of the recipe: (the model with its weights rounded to fp16, those fp16 weights,
    its history, seconds)."""
    torch.manual_seed(config.seed)  # the initial weights
    model = GPT(spec.model)
    t0 = time.perf_counter()
    history = train(model, train_ids, val_ids, config, progress=progress)
    seconds = time.perf_counter() - t0
    stored = copy.deepcopy(model).cpu().half()  # fp16 weights; the tied matrix stays one tensor
    model.load_state_dict(stored.state_dict())  # measure the weights as they will be loaded
    return model, stored, history, seconds


def loss_all(model: GPT, val_ids: torch.Tensor) -> float:
    """The loss a checkpoint records as ``val_loss_all``: every target of ``val_ids``, each from at
    least three quarters of the context (:func:`course_lib.train.evaluate_all`, stride S / 4)."""
    return evaluate_all(model, val_ids, stride=max(1, model.config.context_length // 4))


def build(path: str | os.PathLike | None = None, *, max_steps: int | None = None,
          progress: bool = True, spec: Spec = SHAKESPEARE_CHAR) -> Path:
    """Train ``spec``'s model from scratch and write it to ``path`` (None: the package's own
    ``checkpoints/<name>.pt``); returns the path. ``max_steps`` shortens the run (a smoke test;
    warm-up and evaluation shrink to fit), otherwise the recipe is exactly ``spec.train``. The
    recipe is then run with each of ``spec.other_seeds`` and their ``val_loss_all`` recorded."""
    config = spec.train
    if max_steps is not None:
        config = dataclasses.replace(config, max_steps=max_steps, warmup_steps=min(config.warmup_steps,
                                     max_steps), eval_every=min(config.eval_every, max_steps))
    path = Path(path) if path is not None else CHECKPOINT_DIR / f"{spec.name}.pt"
    train_ids, val_ids = spec.corpus()
    model, stored, history, seconds = _train(spec, config, train_ids, val_ids, progress)
    other_seeds = {}
    for seed in spec.other_seeds:
        other = _train(spec, dataclasses.replace(config, seed=seed), train_ids, val_ids, progress)[0]
        other_seeds[seed] = loss_all(other, val_ids)
    ckpt = {
        "format": _FORMAT,
        "name": spec.name,
        "model_config": dataclasses.asdict(spec.model),
        "train_config": dataclasses.asdict(config),
        "corpus": {"text": "data.shakespeare", "max_chars": spec.max_chars,
                   "val_fraction": spec.val_fraction, "tokenizer": "utf-8 bytes"},
        "val_loss": evaluate(model, val_ids, config),
        "val_loss_all": loss_all(model, val_ids),
        # the same on training text, as much as the validation split: the gap is what it memorized
        "train_loss_all": loss_all(model, train_ids[:len(val_ids)]),
        "val_loss_fp32": history.val_loss[-1],
        "other_seeds": other_seeds,  # seed -> val_loss_all of the same recipe with that seed
        "steps": history.steps[-1] + 1,
        "seconds": seconds,  # of this seed's training
        "torch": str(torch.__version__),
        "state_dict": stored.state_dict(),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(ckpt, f"{path}.tmp")
    os.replace(f"{path}.tmp", path)
    return path


def main(argv: list[str] | None = None) -> int:
    """Command line: ``python -m course_lib.pretrained build [--name NAME] [--max-steps N] [--out PATH]``."""
    parser = argparse.ArgumentParser(prog="python -m course_lib.pretrained")
    sub = parser.add_subparsers(dest="command", required=True)
    cmd = sub.add_parser("build", help="train the shipped checkpoints from scratch and save them")
    cmd.add_argument("--name", choices=sorted(SPECS), default=None, help="only this one (default: all)")
    cmd.add_argument("--max-steps", type=int, default=None, help="shorter runs (default: each recipe's own)")
    cmd.add_argument("--out", default=None, help=f"with --name: the file (default: {CHECKPOINT_DIR}/NAME.pt)")
    cmd.add_argument("--threads", type=int, default=None,
                     help="torch CPU threads (default: torch's choice; 1 can be faster on a busy machine)")
    args = parser.parse_args(argv)
    if args.out is not None and args.name is None:
        parser.error("--out needs --name")
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    for spec in [SPECS[args.name]] if args.name else SPECS.values():
        path = build(args.out, max_steps=args.max_steps, spec=spec)
        info = load_info(path)
        print(f"{path}: {path.stat().st_size:,} bytes, val loss {info['val_loss']:.4f} nats/byte "
              f"after {info['steps']} steps in {info['seconds']:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
