"""A reward model learned from pairwise preferences with the Bradley-Terry loss (chapter 09).

Shapes: ``B`` batch, ``S`` positions, ``D`` d_model.

People find it easier to compare two replies than to score one. Bradley and Terry (1952)
model a comparison as ``P(chosen > rejected) = sigmoid(r(chosen) - r(rejected))`` for some
score ``r``; fitting ``r`` by maximum likelihood is the loss
``-log sigmoid(r_chosen - r_rejected)`` (:func:`bradley_terry_loss`), as in Ouyang et al. (2022,
InstructGPT) and Stiennon et al. (2020). The scorer is a language model with its LM head
replaced by one number::

    prompt + response  --GPT body-->  h (B, S, D)  --h at the last real token-->  (B, D)
                                                   --head: Linear(D, 1)-->  r (B,)

    tokens   t  e  a  :  k  i  n  d  \\n  pad pad
    h                                 ^   the reward reads here (causal: it has seen everything)

:class:`RewardModel` takes any :class:`course_lib.model.GPT` as its body (often a copy of the
SFT model) and reads the final normed hidden states through a forward hook on ``norm_f``, so
the GPT class is used as it is and never copied (STYLE.md, trait 5). Only differences of
rewards are learned: ``r + c`` has the same loss for any constant ``c``.

Left out: the RM's own normalisation to mean 0 (InstructGPT subtracts a bias after training),
comparisons of K > 2 replies at once, and ties or graded preferences.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..model import GPT
from ..train import TrainConfig
from .sft import fit, pack, token_ids
from .tasks import Preference

__all__ = ["bradley_terry_loss", "last_hidden", "RewardModel", "train_reward_model", "pairwise_accuracy"]


def bradley_terry_loss(r_chosen: Tensor, r_rejected: Tensor) -> Tensor:
    """``-log sigmoid(r_chosen - r_rejected)``, averaged over the batch: ``(B,), (B,) -> ()``
    (chapter 09).

    >>> round(bradley_terry_loss(torch.tensor([1.0]), torch.tensor([1.0])).item(), 4)   # log 2
    0.6931
    """
    if r_chosen.shape != r_rejected.shape or r_chosen.dim() != 1:
        raise ValueError(f"r_chosen and r_rejected must both be (B,), got shapes {tuple(r_chosen.shape)} "
                         f"and {tuple(r_rejected.shape)}")
    return -F.logsigmoid(r_chosen.float() - r_rejected.float()).mean()


def last_hidden(gpt: GPT, idx: Tensor, padding_mask: Tensor | None = None) -> Tensor:
    """The final normed hidden states of ``gpt``, ``(B, S) -> (B, S, D)``: what its LM head
    reads. Taken with a forward hook on ``gpt.norm_f`` (an ``nn.Identity`` for post-norm
    models, whose last block already ends in a norm), so this is exactly ``GPT.forward``."""
    captured: list[Tensor] = []
    handle = gpt.norm_f.register_forward_hook(lambda module, inputs, output: captured.append(output))
    try:
        gpt(idx, padding_mask=padding_mask)
    finally:
        handle.remove()
    return captured[0]


class RewardModel(nn.Module):
    """A GPT body and a scalar head: ``forward(idx (B, S), lengths (B,)) -> rewards (B,)``,
    read at position ``lengths[b] - 1`` of right-padded rows (chapter 09).

    >>> from course_lib.model import ModelConfig
    >>> rm = RewardModel(GPT(ModelConfig(d_model=32, n_layers=1, n_heads=2)))
    >>> rm.score(["tea:", "cat:"], ["kind\\n", "dull\\n"]).shape
    torch.Size([2])
    """

    def __init__(self, body: GPT):
        super().__init__()
        if not isinstance(getattr(body, "norm_f", None), nn.Module):
            raise TypeError(f"body must be a course_lib GPT (with a norm_f), got {type(body).__name__}")
        self.body = body
        self.head = nn.Linear(body.config.d_model, 1)

    def forward(self, idx: Tensor, lengths: Tensor) -> Tensor:
        lengths = torch.as_tensor(lengths, device=idx.device)
        if lengths.shape != idx.shape[:1] or (lengths < 1).any() or (lengths > idx.shape[1]).any():
            raise ValueError(f"lengths must be (B,) = ({idx.shape[0]},) with 1 <= length <= "
                             f"S={idx.shape[1]}, got {lengths.tolist()}")
        h = last_hidden(self.body, idx)  # (B, S) -> (B, S, D)
        last = h[torch.arange(idx.shape[0], device=idx.device), lengths - 1]  # (B, S, D) -> (B, D)
        return self.head(last).squeeze(-1).float()  # (B, D) -> (B, 1) -> (B,)

    def _rewards(self, prompts, responses) -> Tensor:
        device = self.head.weight.device
        idx, _ = pack(prompts, responses, device=device)  # (B, S)
        lengths = torch.tensor([len(token_ids(p)) + len(token_ids(r)) for p, r in zip(prompts, responses,
                                                                                       strict=True)])
        return self(idx, lengths.to(device))  # (B,)

    @torch.no_grad()
    def score(self, prompts: Sequence, responses: Sequence) -> Tensor:
        """Rewards ``(B,)`` for texts (or token-id lists), in eval mode, without gradients: the
        reward function that :func:`course_lib.rlhf.policy_gradient.train_rl` takes."""
        was_training = self.training
        self.eval()
        try:
            return self._rewards(prompts, responses)
        finally:
            self.train(was_training)


def _chosen_and_rejected(model: RewardModel, pairs: Sequence[Preference]) -> tuple[Tensor, Tensor]:
    """Rewards of the chosen and of the rejected replies, in one forward of 2B rows."""
    prompts = [p.prompt for p in pairs]
    r = model._rewards(prompts + prompts, [p.chosen for p in pairs] + [p.rejected for p in pairs])  # (2B,)
    return r[:len(pairs)], r[len(pairs):]  # (2B,) -> (B,), (B,)


def train_reward_model(model: RewardModel, pairs: Sequence[Preference], config: TrainConfig, *,
                       progress: bool = True) -> dict[str, list[float]]:
    """Fit ``model`` in place to ``pairs`` with :func:`bradley_terry_loss` (chapter 09), using
    :func:`course_lib.rlhf.sft.fit`. Returns per-step ``{"loss": [...], "accuracy": [...]}``,
    the accuracy on each training batch."""
    if len(pairs) == 0:
        raise ValueError("train_reward_model needs at least one pair, got an empty list")

    def loss_fn(batch):
        r_chosen, r_rejected = _chosen_and_rejected(model, batch)
        accuracy = (r_chosen > r_rejected).float().mean().item()
        return bradley_terry_loss(r_chosen, r_rejected), {"accuracy": accuracy}

    return fit(model, pairs, loss_fn, config, progress=progress, desc="reward model")


@torch.no_grad()
def pairwise_accuracy(model: RewardModel, pairs: Sequence[Preference], batch_size: int = 256) -> float:
    """The fraction of ``pairs`` whose chosen reply gets the higher reward (a tie counts as
    wrong), in eval mode; 0.5 is chance."""
    if len(pairs) == 0:
        raise ValueError("pairwise_accuracy needs at least one pair, got an empty list")
    was_training = model.training
    model.eval()
    right = 0
    for i in range(0, len(pairs), batch_size):
        r_chosen, r_rejected = _chosen_and_rejected(model, pairs[i:i + batch_size])
        right += int((r_chosen > r_rejected).sum())
    model.train(was_training)
    return right / len(pairs)
