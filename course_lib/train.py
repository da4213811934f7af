"""Training a language model: AdamW or Muon, warm-up + cosine schedule, clipping, checkpoints (chapter 03).

The loop in :func:`train` fits on one screen; everything it calls is a small function here, in
:mod:`course_lib.optim` (the optimizers, clipping and the schedule, written out) or in
:mod:`course_lib.data`. One step::

    x, y = get_batch(train_ids)            (B, S), (B, S): y is x shifted by one
    loss = model(x, y)                     mean cross-entropy over B * S next tokens
    loss.backward()                        gradients
    clip_grad_norm(params, grad_clip)      rescale so that ||g||_2 <= grad_clip
    set_lr(optimizer, lr_at(step))         warm-up, then cosine decay
    optimizer.step()                       config.optimizer: AdamW (ours or torch's) or Muon;
                                           decoupled weight decay on matrices only

The learning-rate schedule (``lr_at``), for ``W = warmup_steps`` and ``T = max_steps``::

    lr |      ____
       |     /    `-.
       |    /        `-.
       |   /            `-._
    min|  /                 `----
       +--W-------------------T--> step

Resuming is exact: a checkpoint holds the model, the optimizer's moments, the step, the
history and the state of both random generators (the batch sampler's and torch's, which
dropout uses), so 10 steps + resume + 10 steps gives bit-for-bit the losses of 20 steps.

Device and precision come from :mod:`course_lib.device` (``config.device``,
``config.precision``): the model and the data move to that device, and the forward pass runs
under its bf16 autocast when the precision says so (no gradient scaler: bf16 has fp32's range).

Data-parallel training: start one process per device with ``torchrun``; each calls
``init_process_group`` and then :func:`train` as usual. :func:`train` sees the world size ``W``,
wraps the model in ``DistributedDataParallel`` (DDP) and splits every batch::

    all ranks:  x, y = get_batch(...)       the same global batch (B, S): the same seeded sampler
    rank r:     x[r*B/W : (r+1)*B/W]        its own B / W rows
    backward:   DDP averages the gradients  so every rank takes the step of one process on (B, S)

A script ``fit.py`` for ``torchrun --nproc_per_node 2 fit.py``::

    import torch.distributed as dist
    dist.init_process_group()          # rank and world size from torchrun; gloo on CPU, nccl on GPU
    history = train(model, train_ids, val_ids, config)
    dist.destroy_process_group()

Every rank evaluates (the same batches on the same weights) and returns the same losses, the
train loss averaged over ranks; only rank 0 shows the progress bar and writes checkpoints.
Dropout is seeded with ``seed + rank`` (different masks per rank), so with dropout a DDP run
matches one process in distribution only, and resuming restores rank 0's generator everywhere.

Left out: gradient accumulation, sharded training (FSDP, ZeRO), ``torch.compile``,
mixed-precision fp16 with a gradient scaler, and early stopping.
"""

from __future__ import annotations

import dataclasses
import os
import time
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import nn
from tqdm.auto import tqdm

from .data import get_batch
from .device import DEVICES, PRECISIONS, autocast, get_device
from .optim import AdamW, Muon, clip_grad_norm, cosine_schedule, split_for_muon

__all__ = ["TrainConfig", "History", "lr_at", "make_optimizer", "set_lr", "evaluate", "evaluate_all",
           "loss_by_position", "train", "save_checkpoint", "load_checkpoint", "plot_history"]

OPTIMIZERS = ("adamw", "torch-adamw", "muon")


@dataclass(frozen=True)
class TrainConfig:
    """How to train (chapter 03); the model's shape is :class:`course_lib.model.ModelConfig`.

    Defaults train the default tiny GPT on a laptop CPU in about a minute. Change fields with
    ``dataclasses.replace``.

    >>> TrainConfig(max_steps=100, warmup_steps=10).lr
    0.001
    """

    max_steps: int = 500                 # optimizer updates in all (the schedule ends here)
    batch_size: int = 16                 # B windows per step
    lr: float = 1e-3                     # peak learning rate, reached at the end of warm-up
    min_lr: float = 1e-4                 # learning rate at max_steps (the cosine's floor)
    warmup_steps: int = 50               # linear warm-up from 0 to lr over these steps
    optimizer: str = "adamw"             # "adamw" (ours) | "torch-adamw" | "muon" (see make_optimizer)
    muon_lr: float = 0.02                # Muon's peak lr for hidden matrices (scheduled like lr)
    weight_decay: float = 0.1            # decoupled weight decay, on matrices only (see make_optimizer)
    betas: tuple[float, float] = (0.9, 0.95)  # AdamW's moment decay rates (GPT-3's 0.95 for beta2)
    grad_clip: float | None = 1.0        # clip the global gradient L2 norm to this; None = no clipping
    eval_every: int = 100                # evaluate on the validation set every this many steps
    eval_batches: int = 10               # batches averaged per evaluation (same batches every time)
    seed: int = 0                        # seeds the batch sampler, dropout and the evaluation batches
    device: str = "auto"                 # course_lib.device.get_device: "auto", "cpu", "cuda[:N]", "mps"
    precision: str = "auto"              # "auto" | "fp32" | "bf16" (bf16 autocast; opt-in on CPU)
    checkpoint_path: str | None = None   # where to save (and resume from); None = never save
    checkpoint_every: int | None = None  # also save every this many steps; None = only at the end

    def __post_init__(self):
        for name in ("max_steps", "batch_size", "eval_every", "eval_batches"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        if not self.lr > 0:
            raise ValueError(f"lr must be > 0, got {self.lr!r}")
        if not 0 <= self.min_lr <= self.lr:
            raise ValueError(f"min_lr must be in [0, lr={self.lr}], got {self.min_lr!r}")
        if not 0 <= self.warmup_steps <= self.max_steps:
            raise ValueError(f"warmup_steps must be in [0, max_steps={self.max_steps}], "
                             f"got {self.warmup_steps!r}")
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"optimizer must be one of {OPTIMIZERS}, got {self.optimizer!r}")
        if not self.muon_lr > 0:
            raise ValueError(f"muon_lr must be > 0, got {self.muon_lr!r}")
        if self.weight_decay < 0:
            raise ValueError(f"weight_decay must be >= 0, got {self.weight_decay!r}")
        if len(self.betas) != 2 or not all(0 <= b < 1 for b in self.betas):
            raise ValueError(f"betas must be two numbers in [0, 1), got {self.betas!r}")
        if self.grad_clip is not None and not self.grad_clip > 0:
            raise ValueError(f"grad_clip must be > 0 or None, got {self.grad_clip!r}")
        if self.device.split(":")[0] not in DEVICES:
            raise ValueError(f"device must be one of {DEVICES} (or 'cuda:N'), got {self.device!r}")
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {PRECISIONS}, got {self.precision!r}")
        if self.checkpoint_every is not None:
            if isinstance(self.checkpoint_every, bool) or self.checkpoint_every < 1:
                raise ValueError(f"checkpoint_every must be >= 1 or None, got {self.checkpoint_every!r}")
            if self.checkpoint_path is None:
                raise ValueError(f"checkpoint_every={self.checkpoint_every} needs a checkpoint_path")


@dataclass
class History:
    """What :func:`train` measured. Train lists have one entry per step; val lists one per
    evaluation. ``steps[i]`` counts the updates made before ``train_loss[i]`` was measured
    (so ``steps`` starts at 0), and ``val_loss[j]`` is the model after ``val_steps[j]``
    updates; ``seconds[i]`` is the wall time since training began, summed over resumes."""

    steps: list[int] = field(default_factory=list)
    train_loss: list[float] = field(default_factory=list)
    lr: list[float] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)
    val_steps: list[int] = field(default_factory=list)
    val_loss: list[float] = field(default_factory=list)


def lr_at(step: int, config: TrainConfig) -> float:
    """The learning rate for update number ``step`` (0-based), drawn in the module docstring:
    :func:`course_lib.optim.cosine_schedule` with the config's ``lr``, ``min_lr``,
    ``warmup_steps`` and ``max_steps``.

    >>> c = TrainConfig(max_steps=110, warmup_steps=10, lr=1.0, min_lr=0.0)
    >>> [round(lr_at(s, c), 3) for s in (0, 5, 10, 60, 110)]
    [0.0, 0.5, 1.0, 0.5, 0.0]
    """
    return cosine_schedule(step, lr=config.lr, min_lr=config.min_lr, warmup_steps=config.warmup_steps,
                           max_steps=config.max_steps)


def make_optimizer(model: nn.Module, config: TrainConfig) -> torch.optim.Optimizer:
    """The optimizer ``config.optimizer`` names, over the trainable parameters of ``model``.

    ``"adamw"`` (:class:`course_lib.optim.AdamW`) and ``"torch-adamw"`` (``torch.optim.AdamW``,
    the same numbers) take two groups: weight decay on every parameter with 2 or more dimensions
    (Linear weights and the token/position embeddings, as nanoGPT and GPT-2 do: the tied
    embedding is also the output matrix) and none on 1-D ones (biases, norm gains: decaying a
    gain towards 0 only fights the norm). A tied matrix is one Parameter and is listed once.

    ``"muon"`` (:class:`course_lib.optim.Muon`) puts the hidden Linear weights in a Muon group
    at ``muon_lr`` (its ``lr_scale = muon_lr / lr`` tells :func:`set_lr` to keep that ratio
    along the schedule) and the rest in the same two AdamW groups; every matrix is decayed.
    """
    if config.optimizer == "muon":
        matrices, rest = split_for_muon(model)  # trainable parameters only, as below
    else:
        matrices, rest = [], [p for p in model.parameters() if p.requires_grad]
    groups = [{"params": [p for p in rest if p.dim() >= 2], "weight_decay": config.weight_decay},
              {"params": [p for p in rest if p.dim() < 2], "weight_decay": 0.0}]
    if config.optimizer == "torch-adamw":
        return torch.optim.AdamW(groups, lr=config.lr, betas=config.betas)
    if config.optimizer == "adamw":
        return AdamW(groups, lr=config.lr, betas=config.betas)
    muon = {"params": matrices, "lr": config.muon_lr, "lr_scale": config.muon_lr / config.lr,
            "weight_decay": config.weight_decay}
    return Muon([muon] + [{**g, "use_muon": False} for g in groups], lr=config.lr, betas=config.betas)


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    """Set every param group's learning rate to ``lr * group["lr_scale"]`` (1 where unset, so
    exactly ``lr``): the schedule moves all groups together, Muon's at its own multiple."""
    for group in optimizer.param_groups:
        group["lr"] = lr * group.get("lr_scale", 1.0)


@torch.no_grad()
def evaluate(model: nn.Module, ids: torch.Tensor, config: TrainConfig) -> float:
    """Mean loss of ``model`` over ``config.eval_batches`` batches of ``ids`` (chapter 03).

    The batches come from a generator seeded with ``config.seed``, built afresh each call, so
    every evaluation sees the same windows and the same model gives the same number. Runs in
    eval mode (no dropout) on the model's device and restores the previous mode.
    """
    device = next(model.parameters()).device
    generator = torch.Generator().manual_seed(config.seed)
    was_training = model.training
    model.eval()
    losses = []
    for _ in range(config.eval_batches):
        x, y = get_batch(ids, config.batch_size, model.config.context_length, generator=generator,
                         device=device)
        with autocast(device, config.precision):
            losses.append(model(x, y)[1].float())
    model.train(was_training)
    return torch.stack(losses).mean().item()


@torch.no_grad()
def evaluate_all(model: nn.Module, ids: torch.Tensor, *, stride: int = 1, batch_size: int = 64) -> float:
    """Mean next-token loss of ``model`` over *every* target ``ids[1:]``, each scored once, in nats
    per token (chapter 03): the number to compare with another model that scores the same targets
    (``course_lib.ngram.cross_entropy(ngram_model, ids)``). Runs in eval mode, in fp32, on the
    model's device, and restores the previous mode.

    Windows of ``S = context_length`` tokens start every ``stride`` tokens (a sliding window). The
    first window scores all its targets; each later one only the targets the windows before it did
    not reach, its last ``stride`` (fewer at the end, where the last window ends at the last
    target). So every target after the first ``S`` is predicted from at least ``S - stride + 1``
    tokens: with ``stride=1`` (the default) from all ``S`` a model can take, exactly as a count
    model conditions on all the ``n - 1`` it can take. ``stride=S`` cuts the text into fresh windows
    whose first targets see only a few tokens (cheaper by a factor of ``S``, and worse)::

        ids:      t0 t1 t2 t3 t4 t5 t6       S = 3, stride = 2: windows start at 0, 2 and 3
        window 0: [t0 t1 t2]               -> targets t1 t2 t3, all scored
        window 1:       [t2 t3 t4]         -> targets t3 t4 t5, scored t4 t5
        window 2:          [t3 t4 t5]      -> targets t4 t5 t6, scored t6
    """
    S, N = model.config.context_length, len(ids)
    if N < S + 1:
        raise ValueError(f"ids must hold at least context_length + 1 = {S + 1} tokens, got {N}")
    if not 1 <= stride <= S:
        raise ValueError(f"stride must be in 1..context_length = {S}, got {stride}")
    starts = list(range(0, N - S, stride))
    if starts[-1] != N - 1 - S:
        starts.append(N - 1 - S)  # the last window ends at the last target
    starts = torch.tensor(starts)  # (W,)
    scored = torch.cat([torch.tensor([0]), starts[:-1] + S])  # (W,): targets up to this index were scored
    device = next(model.parameters()).device
    offsets = torch.arange(S)  # (S,)
    was_training = model.training
    model.eval()
    total = 0.0
    for i in range(0, len(starts), batch_size):
        first = starts[i:i + batch_size, None]  # (b, 1)
        x = ids[first + offsets].to(device)  # (b, S)
        y = ids[first + offsets + 1].to(device)  # (b, S): the target of position p has index first + p + 1
        new = (first + offsets + 1 > scored[i:i + batch_size, None]).flatten().to(device)  # (b S,)
        logits, _ = model(x)  # (b, S, V)
        nll = nn.functional.cross_entropy(logits.float().flatten(0, 1), y.flatten(), reduction="none")
        total += nll[new].sum().item()
    model.train(was_training)
    return total / (N - 1)


@torch.no_grad()
def loss_by_position(model: nn.Module, ids: torch.Tensor, *, stride: int | None = None,
                     batch_size: int = 64) -> torch.Tensor:
    """The mean loss at each position of windows of ``S = context_length`` tokens that start every
    ``stride`` tokens (None: ``S``, windows that cut ``ids`` into pieces): entry ``p`` is the loss
    of predicting a token from the ``p + 1`` tokens before it (chapter 03's loss against context
    length; a smaller stride averages more windows). (N,) -> (S,), float64."""
    S, N = model.config.context_length, len(ids)
    stride = S if stride is None else stride
    if N < S + 1:
        raise ValueError(f"ids must hold at least context_length + 1 = {S + 1} tokens, got {N}")
    if stride < 1:
        raise ValueError(f"stride must be at least 1, got {stride}")
    starts = torch.arange(0, N - S, stride)  # (W,)
    device = next(model.parameters()).device
    offsets = torch.arange(S)
    was_training = model.training
    model.eval()
    total = torch.zeros(S, dtype=torch.float64)
    for i in range(0, len(starts), batch_size):
        first = starts[i:i + batch_size, None]  # (b, 1)
        logits, _ = model(ids[first + offsets].to(device))  # (b, S, V)
        nll = nn.functional.cross_entropy(logits.float().transpose(1, 2), ids[first + offsets + 1].to(device),
                                          reduction="none")  # (b, S)
        total += nll.double().sum(0).cpu()
    model.train(was_training)
    return total / len(starts)


def save_checkpoint(path: str | os.PathLike, model: nn.Module, optimizer: torch.optim.Optimizer,
                    step: int, history: History, generator: torch.Generator) -> None:
    """Write everything :func:`train` needs to resume exactly (written to ``path.tmp`` first
    and renamed, so a crash mid-save leaves the previous checkpoint intact)."""
    state = {
        "step": step,  # updates done, i.e. the next step to run
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "history": dataclasses.asdict(history),
        "batch_rng": generator.get_state(),  # the batch sampler
        "torch_rng": torch.get_rng_state(),  # dropout on the CPU
        "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else [],
        "model_config": dataclasses.asdict(model.config) if hasattr(model, "config") else None,
    }
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    torch.save(state, f"{path}.tmp")
    os.replace(f"{path}.tmp", path)


def load_checkpoint(path: str | os.PathLike) -> dict:
    """The dict :func:`save_checkpoint` wrote, on the CPU (tensors only, ``weights_only``).
    ``GPT(ModelConfig(**ckpt["model_config"])).load_state_dict(ckpt["model"])`` rebuilds the model."""
    return torch.load(path, map_location="cpu", weights_only=True)


def _resume(config: TrainConfig, model, optimizer, generator) -> tuple[int, History]:
    if config.checkpoint_path is None or not os.path.exists(config.checkpoint_path):
        raise ValueError(f"resume=True needs an existing checkpoint_path, got {config.checkpoint_path!r}")
    ckpt = load_checkpoint(config.checkpoint_path)
    model.load_state_dict(ckpt["model"])
    optimizer.load_state_dict(ckpt["optimizer"])  # moves the moments to the parameters' device
    generator.set_state(ckpt["batch_rng"])
    torch.set_rng_state(ckpt["torch_rng"])
    if ckpt["cuda_rng"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(ckpt["cuda_rng"])
    return ckpt["step"], History(**ckpt["history"])


def _world(config: TrainConfig) -> tuple[int, int, torch.device]:
    """``(rank, W, device)`` of this process: ``(0, 1, config's device)`` unless
    ``torch.distributed`` is initialised (a ``torchrun`` script); then each process on a GPU
    machine takes its own GPU (``cuda:LOCAL_RANK``), and ``batch_size`` must split into W shares."""
    device = get_device(config.device)
    if not (dist.is_available() and dist.is_initialized()):
        return 0, 1, device
    rank, world = dist.get_rank(), dist.get_world_size()
    if config.batch_size % world:
        raise ValueError(f"batch_size={config.batch_size} must be divisible by the world size {world}: "
                         f"each of the {world} processes trains on batch_size // {world} windows")
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", rank)))
        torch.cuda.set_device(device)
    return rank, world, device


def _data_parallel(model: nn.Module, device: torch.device, world: int) -> nn.Module:
    """``model`` in DDP when ``W > 1`` (it copies rank 0's weights to every rank, then averages
    the gradients during backward), else ``model`` itself."""
    if world == 1:
        return model
    return nn.parallel.DistributedDataParallel(model, device_ids=[device] if device.type == "cuda" else None)


def _mean_over_ranks(loss: torch.Tensor, world: int) -> float:
    """The global batch's loss: the mean of the W ranks' losses (equal shares, so equal weights)."""
    if world > 1:
        loss = loss.detach().clone()
        dist.all_reduce(loss)  # sum over ranks, in place
        loss /= world
    return loss.item()


def train(model: nn.Module, train_ids: torch.Tensor, val_ids: torch.Tensor, config: TrainConfig, *,
          resume: bool = False, progress: bool = True, stop_at: int | None = None) -> History:
    """Train ``model`` (a :class:`course_lib.model.GPT`, or anything with ``.config.context_length``
    and ``forward(x, y) -> (logits, loss)``) in place on windows of ``train_ids`` (chapter 03).

    Evaluates on ``val_ids`` every ``eval_every`` steps and at the end; saves a checkpoint every
    ``checkpoint_every`` steps and at the end when ``checkpoint_path`` is set. ``resume=True``
    continues from ``checkpoint_path`` exactly where it stopped. ``stop_at`` ends the run after
    that many updates (saving a checkpoint), as if interrupted, while the schedule still runs to
    ``max_steps``: a notebook can train in several cells. Returns the :class:`History`.

    Under ``torchrun`` (``torch.distributed`` initialised, W > 1 processes) each rank trains on
    its ``batch_size // W`` rows of the same global batch with DDP (see the module docstring).
    """
    rank, world, device = _world(config)  # (0, 1, device) without torch.distributed
    model.to(device)
    train_ids, val_ids = train_ids.to(device), val_ids.to(device)
    optimizer = make_optimizer(model, config)
    batches = torch.Generator().manual_seed(config.seed)  # the sampler's own RNG, on the CPU
    if resume:
        start, history = _resume(config, model, optimizer, batches)
    else:
        start, history = 0, History()
        torch.manual_seed(config.seed + rank)  # dropout
    end = config.max_steps if stop_at is None else min(stop_at, config.max_steps)
    t0 = time.perf_counter() - (history.seconds[-1] if history.seconds else 0.0)
    ddp = _data_parallel(model, device, world)  # model itself when W == 1
    model.train()
    # A run told to stop early (stop_at) ends its bar full: a partial bar reads as a failure.
    bar = tqdm(range(start, end), initial=start, total=end, disable=not progress or rank != 0,
               desc="train" if end == config.max_steps else f"train (to step {end} of {config.max_steps})")
    for step in bar:
        if step % config.eval_every == 0:
            history.val_steps.append(step)
            history.val_loss.append(evaluate(model, val_ids, config))
        lr = lr_at(step, config)
        set_lr(optimizer, lr)
        x, y = get_batch(train_ids, config.batch_size, model.config.context_length, generator=batches)
        x, y = x.chunk(world)[rank], y.chunk(world)[rank]  # (B, S) -> (B / W, S): this rank's rows
        with autocast(device, config.precision):
            _, loss = ddp(x, y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if config.grad_clip is not None:
            clip_grad_norm(model.parameters(), config.grad_clip)
        optimizer.step()

        history.steps.append(step)
        history.train_loss.append(_mean_over_ranks(loss, world))
        history.lr.append(lr)
        history.seconds.append(time.perf_counter() - t0)
        bar.set_postfix(loss=f"{history.train_loss[-1]:.3f}",
                        val=f"{history.val_loss[-1]:.3f}" if history.val_loss else "-")
        done = step + 1
        if config.checkpoint_every and done % config.checkpoint_every == 0 and done < end and rank == 0:
            save_checkpoint(config.checkpoint_path, model, optimizer, done, history, batches)
    if end == config.max_steps and (not history.val_steps or history.val_steps[-1] != end):
        history.val_steps.append(end)  # the final model, always evaluated
        history.val_loss.append(evaluate(model, val_ids, config))
    if config.checkpoint_path is not None and rank == 0:
        save_checkpoint(config.checkpoint_path, model, optimizer, end, history, batches)
    return history


def plot_history(history: History, ax=None):
    """Train and validation loss against step on ``ax`` (a new figure if None); returns the
    matplotlib Axes. The train curve is per batch (noisy), validation a mean over batches."""
    import matplotlib.pyplot as plt  # here, not at import: importing course_lib draws nothing

    if ax is None:
        _, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(history.steps, history.train_loss, label="train", alpha=0.7)
    ax.plot(history.val_steps, history.val_loss, "o-", label="validation")
    ax.set_xlabel("step")
    ax.set_ylabel("loss (nats per token)")
    ax.legend()
    return ax
