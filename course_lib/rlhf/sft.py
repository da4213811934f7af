"""Responses to prompts: batches, masks, log-probabilities, and supervised fine-tuning (chapter 09).

Shapes: ``B`` batch, ``S`` positions, ``V`` vocabulary.

Every method of the chapter scores a *response* given its *prompt*. A batch puts each
``prompt + response`` in a row, padded on the right; a boolean mask marks the response tokens.
A causal model never looks right, so right padding changes nothing at the real positions and
needs no ``padding_mask``::

    position t      0   1   2   3   4   5
    tokens          3   +   4   =   7   \\n      prompt "3+4=", response "7\\n"
    response mask   .   .   .   .   x   x       True at prompt_length <= t < total_length
    logits[t - 1]   predicts tokens[t]: the logits at 3 ("=") give log p("7" | "3+4=")

:func:`token_logprobs` returns ``log p(tokens[t] | tokens[:t])`` *at position t* (0 at t = 0,
which nothing predicts), so it lines up with the tokens and the mask, and
:func:`sequence_logprobs` sums it over the mask: ``log p(response | prompt)``.

Supervised fine-tuning (SFT, the first step after pre-training in Ouyang et al., 2022,
"Training language models to follow instructions with human feedback") is cross-entropy on the
response tokens of demonstrations; :func:`sft_batch` gives the prompt tokens target ``-100``
so that :class:`course_lib.model.GPT`'s own loss skips them. :func:`fit` is the small training
loop that SFT, the reward model and DPO share: :func:`course_lib.train.make_optimizer` and
:func:`course_lib.train.lr_at` on minibatches of examples, configured by a
:class:`course_lib.train.TrainConfig`.

Left out: packing several short examples into one row, loss on multi-turn chat templates,
and chat special tokens (the end marker is a newline byte).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from tqdm.auto import tqdm

from ..device import autocast
from ..train import TrainConfig, lr_at, make_optimizer, set_lr
from .tasks import encode

__all__ = ["token_ids", "response_mask", "pack", "token_logprobs", "sequence_logprobs", "sft_batch",
           "fit", "frozen_copy", "supervised_finetune", "response_loss"]


def token_ids(text_or_ids) -> list[int]:
    """A str as its UTF-8 bytes (:func:`course_lib.rlhf.tasks.encode`), or a sequence of ids as a list.

    >>> token_ids("7\\n"), token_ids([55, 10])
    ([55, 10], [55, 10])
    """
    return encode(text_or_ids) if isinstance(text_or_ids, str) else [int(i) for i in text_or_ids]


def response_mask(prompt_lengths, total_lengths, S: int) -> Tensor:
    """Bool ``(B, S)``, True where ``prompt_lengths[b] <= t < total_lengths[b]``: the response
    tokens of right-padded rows, prompt and padding False (chapter 09). Follows
    ``prompt_lengths``' device.

    >>> response_mask(torch.tensor([2, 1]), torch.tensor([4, 2]), 5).int()
    tensor([[0, 0, 1, 1, 0],
            [0, 1, 0, 0, 0]], dtype=torch.int32)
    """
    prompt_lengths, total_lengths = torch.as_tensor(prompt_lengths), torch.as_tensor(total_lengths)
    if prompt_lengths.dim() != 1 or prompt_lengths.shape != total_lengths.shape:
        raise ValueError(f"prompt_lengths and total_lengths must both be (B,), got shapes "
                         f"{tuple(prompt_lengths.shape)} and {tuple(total_lengths.shape)}")
    if (prompt_lengths < 1).any():
        raise ValueError(f"every prompt needs >= 1 token (the first response token is predicted from "
                         f"it), got prompt_lengths {prompt_lengths.tolist()}")
    if (total_lengths < prompt_lengths).any() or (total_lengths > S).any():
        raise ValueError(f"need prompt_lengths <= total_lengths <= S={S}, got prompt_lengths "
                         f"{prompt_lengths.tolist()} and total_lengths {total_lengths.tolist()}")
    t = torch.arange(S, device=prompt_lengths.device)  # (S,)
    return (t >= prompt_lengths[:, None]) & (t < total_lengths[:, None].to(t.device))  # (B, S)


def pack(prompts, responses, *, pad_id: int = 0, device=None) -> tuple[Tensor, Tensor]:
    """Rows ``prompt + response``, right-padded with ``pad_id`` -> ``(idx (B, S) long, mask (B, S)
    bool)``, ``mask`` from :func:`response_mask`. Each prompt and response is a str (bytes) or a
    list of token ids; ``S`` is the longest row.

    >>> idx, mask = pack(["3+4=", "1+1="], ["7\\n", "2\\n"])
    >>> idx.shape, mask[0].int().tolist()
    (torch.Size([2, 6]), [0, 0, 0, 0, 1, 1])
    """
    if len(prompts) == 0 or len(prompts) != len(responses):
        raise ValueError(f"need as many responses as prompts, and at least one; got {len(prompts)} "
                         f"prompts and {len(responses)} responses")
    rows = [(token_ids(p), token_ids(r)) for p, r in zip(prompts, responses, strict=True)]
    S = max(len(p) + len(r) for p, r in rows)
    idx = torch.full((len(rows), S), pad_id, dtype=torch.long)
    for b, (p, r) in enumerate(rows):
        idx[b, :len(p) + len(r)] = torch.tensor(p + r, dtype=torch.long)
    prompt_lengths = torch.tensor([len(p) for p, _ in rows])  # (B,)
    total_lengths = torch.tensor([len(p) + len(r) for p, r in rows])  # (B,)
    mask = response_mask(prompt_lengths, total_lengths, S)  # (B, S)
    return idx.to(device), mask.to(device)


def token_logprobs(logits: Tensor, tokens: Tensor) -> Tensor:
    """``out[b, t] = log softmax(logits[b, t - 1])[tokens[b, t]]`` for ``t >= 1``, and 0 at
    ``t = 0`` (no logits predict the first token): ``(B, S, V), (B, S) -> (B, S)``, in fp32
    (chapter 09).

    The naive equivalent, position by position:
    ``-F.cross_entropy(logits[:, :-1].transpose(1, 2), tokens[:, 1:], reduction="none")``.

    >>> logits = torch.zeros(1, 3, 4)                   # uniform over V = 4
    >>> token_logprobs(logits, torch.tensor([[0, 1, 2]]))
    tensor([[ 0.0000, -1.3863, -1.3863]])
    """
    if logits.dim() != 3 or tokens.shape != logits.shape[:2]:
        raise ValueError(f"logits must be (B, S, V) and tokens (B, S), got shapes {tuple(logits.shape)} "
                         f"and {tuple(tokens.shape)}")
    logp = F.log_softmax(logits[:, :-1].float(), dim=-1)  # (B, S - 1, V): predictions for t = 1 .. S - 1
    picked = logp.gather(-1, tokens[:, 1:, None]).squeeze(-1)  # (B, S - 1, 1) -> (B, S - 1)
    return F.pad(picked, (1, 0))  # (B, S - 1) -> (B, S): 0 in front, for t = 0


def sequence_logprobs(logits: Tensor, tokens: Tensor, mask: Tensor) -> Tensor:
    """``log p(masked tokens | everything before them)`` (chapter 09): :func:`token_logprobs`
    summed over the positions where ``mask (B, S)`` is True -> ``(B,)``. With a :func:`response_mask` this is
    ``log p(response | prompt)``. ``mask[:, 0]`` must be False: nothing predicts token 0."""
    if mask.dtype != torch.bool or mask.shape != tokens.shape:
        raise ValueError(f"mask must be a bool tensor of tokens' shape {tuple(tokens.shape)}, got "
                         f"shape {tuple(mask.shape)}, dtype {mask.dtype}")
    if mask.shape[1] and bool(mask[:, 0].any()):
        raise ValueError("mask[:, 0] must be False: no logits predict the first token of a row")
    return (token_logprobs(logits, tokens) * mask).sum(-1)  # (B, S) -> (B,)


def sft_batch(prompts, responses, *, pad_id: int = 0, device=None) -> tuple[Tensor, Tensor]:
    """Inputs and targets for SFT -> ``(idx (B, S - 1), targets (B, S - 1))``: row ``b`` is
    ``prompt + response`` without its last token, ``targets`` the next tokens, with ``-100`` on
    prompt tokens and padding, so ``GPT(idx, targets)`` is the cross-entropy of the responses.

    >>> idx, targets = sft_batch(["3+4="], ["7\\n"])
    >>> idx.tolist(), targets.tolist()                  # "3+4=7" -> ". . . 7 \\n"
    ([[51, 43, 52, 61, 55]], [[-100, -100, -100, 55, 10]])
    """
    if any(len(token_ids(r)) == 0 for r in responses):
        raise ValueError("every response needs >= 1 token: an empty response has nothing to learn")
    idx, mask = pack(prompts, responses, pad_id=pad_id, device=device)  # (B, S), (B, S)
    targets = idx.masked_fill(~mask, -100)  # (B, S): only response tokens are targets
    return idx[:, :-1], targets[:, 1:]  # (B, S) -> (B, S - 1): targets[t] = idx[t + 1]


def fit(model: nn.Module, examples: Sequence, loss_fn: Callable, config: TrainConfig, *,
        progress: bool = True, desc: str = "fit") -> dict[str, list[float]]:
    """``config.max_steps`` optimizer steps (chapter 09; ``config.optimizer``, AdamW by default):
    each draws ``config.batch_size`` examples with replacement (seeded by ``config.seed``) and
    minimises ``loss_fn(batch)``.

    ``loss_fn`` returns a scalar loss, or ``(loss, stats)`` with a dict of floats to record.
    Uses :func:`course_lib.train.make_optimizer` (trainable parameters only), the warm-up +
    cosine :func:`course_lib.train.lr_at`, ``config.grad_clip`` and ``config.precision`` (bf16
    autocast when asked). The model stays on its device; ``config.device`` and the evaluation
    and checkpoint fields are not used. Returns ``{"loss": [...], **stats}``, one entry per step.
    """
    if len(examples) == 0:
        raise ValueError("fit needs at least one example, got an empty list")
    device = next(model.parameters()).device
    optimizer = make_optimizer(model, config)
    generator = torch.Generator().manual_seed(config.seed)
    history: dict[str, list[float]] = {"loss": []}
    was_training = model.training
    model.train()
    for step in tqdm(range(config.max_steps), desc=desc, disable=not progress):
        set_lr(optimizer, lr_at(step, config))  # Muon's matrices keep their own multiple
        picks = torch.randint(len(examples), (config.batch_size,), generator=generator).tolist()
        with autocast(device, config.precision):
            out = loss_fn([examples[i] for i in picks])
        loss, stats = out if isinstance(out, tuple) else (out, {})
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if config.grad_clip is not None:
            nn.utils.clip_grad_norm_([p for p in model.parameters() if p.requires_grad], config.grad_clip)
        optimizer.step()
        history["loss"].append(loss.item())
        for key, value in stats.items():
            history.setdefault(key, []).append(float(value))
    model.train(was_training)
    return history


def frozen_copy(model: nn.Module) -> nn.Module:
    """A deep copy in eval mode with every parameter frozen: the *reference* policy that the KL
    penalty (and DPO) measure against."""
    ref = copy.deepcopy(model).eval()
    for p in ref.parameters():
        p.requires_grad_(False)
    return ref


def supervised_finetune(model: nn.Module, demonstrations: Sequence[tuple], config: TrainConfig, *,
                        progress: bool = True) -> dict[str, list[float]]:
    """SFT (chapter 09): train ``model`` in place on ``(prompt, response)`` demonstrations,
    cross-entropy on the response tokens only (mean over the batch's response tokens), with
    :func:`fit`. Returns ``{"loss": [...]}`` per step."""
    device = next(model.parameters()).device

    def loss_fn(batch):
        idx, targets = sft_batch([p for p, _ in batch], [r for _, r in batch], device=device)
        return model(idx, targets)[1]

    return fit(model, demonstrations, loss_fn, config, progress=progress, desc="sft")


@torch.no_grad()
def response_loss(model: nn.Module, demonstrations: Sequence[tuple], batch_size: int = 64) -> float:
    """Mean cross-entropy per response token of ``model`` on ``(prompt, response)`` pairs (nats),
    in eval mode; the mode is restored afterwards."""
    if len(demonstrations) == 0:
        raise ValueError("response_loss needs at least one demonstration, got an empty list")
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    for i in range(0, len(demonstrations), batch_size):
        chunk = demonstrations[i:i + batch_size]
        idx, mask = pack([p for p, _ in chunk], [r for _, r in chunk], device=device)  # (B, S), (B, S)
        total -= sequence_logprobs(model(idx)[0], idx, mask).sum().item()
        count += int(mask.sum())
    model.train(was_training)
    return total / count
