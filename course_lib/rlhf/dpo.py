"""Direct Preference Optimization: fit the policy to preference pairs, no reward model, no sampling
(chapter 09; Rafailov et al., 2023, "Direct Preference Optimization: Your Language Model is
Secretly a Reward Model").

Shapes: ``B`` pairs.

The KL-regularised objective of RLHF, ``max E[r] - beta KL(pi || pi_ref)``, has a closed-form
optimum, ``pi*(y|x) = pi_ref(y|x) exp(r(x, y) / beta) / Z(x)``. Turned around, every policy
defines a reward ``r = beta log pi/pi_ref + beta log Z(x)``; in the Bradley-Terry loss only
*differences* of rewards for the same prompt appear, so ``Z(x)`` cancels and the reward model
disappears::

    RLHF:  pairs --Bradley-Terry--> reward model --sample, REINFORCE, KL leash--> policy
    DPO:   pairs ------------- Bradley-Terry on beta log pi/pi_ref ------------> policy

    loss = -log sigmoid( beta * [ (log pi(y_w|x) - log pi_ref(y_w|x))
                                - (log pi(y_l|x) - log pi_ref(y_l|x)) ] )     y_w chosen, y_l rejected

:func:`dpo_loss` is that formula on sequence log-probabilities (sums over response tokens,
:func:`course_lib.rlhf.sft.sequence_logprobs`), averaged over the batch, in the form of
torchtune's ``DPOLoss``; it also returns the implicit rewards ``beta (log pi - log pi_ref)``.
``beta`` plays the KL weight's part: small beta lets the policy move far from the reference.

Left out: label smoothing (conservative DPO), IPO's squared loss, length normalisation, and
the SFT term some recipes add to the chosen responses.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..train import TrainConfig
from .sft import fit, pack, sequence_logprobs
from .tasks import Preference

__all__ = ["dpo_loss", "pair_logprobs", "train_dpo"]


def dpo_loss(policy_chosen_logps: Tensor, policy_rejected_logps: Tensor, ref_chosen_logps: Tensor,
             ref_rejected_logps: Tensor, beta: float = 0.1) -> tuple[Tensor, Tensor, Tensor]:
    """The DPO loss, averaged over the batch, and the implicit rewards (chapter 09):
    ``(B,) x 4 -> (loss (), chosen_rewards (B,), rejected_rewards (B,))``.

    ``loss = mean_b -log sigmoid(beta * ((pc - rc) - (pr - rr)))`` with ``p``/``r`` the policy's
    and the reference's sequence log-probabilities of the chosen (``c``) and rejected (``r``)
    responses; ``chosen_rewards = beta * (pc - rc)`` and ``rejected_rewards = beta * (pr - rr)``,
    detached (for logging: their difference is the margin the loss pushes up).

    >>> loss, chosen, rejected = dpo_loss(torch.tensor([-1.0]), torch.tensor([-2.0]),
    ...                                   torch.tensor([-1.5]), torch.tensor([-1.5]), beta=0.5)
    >>> round(loss.item(), 4), chosen, rejected          # -log sigmoid(0.5 * (0.5 + 0.5))
    (0.4741, tensor([0.2500]), tensor([-0.2500]))
    """
    if not beta > 0:
        raise ValueError(f"beta must be > 0, got {beta!r}")
    shapes = [tuple(t.shape) for t in (policy_chosen_logps, policy_rejected_logps, ref_chosen_logps,
                                       ref_rejected_logps)]
    if len(set(shapes)) != 1 or len(shapes[0]) != 1:
        raise ValueError(f"the four log-probability tensors must all be (B,), got shapes {shapes}")
    chosen_logratios = policy_chosen_logps.float() - ref_chosen_logps.float()  # (B,) log pi/pi_ref
    rejected_logratios = policy_rejected_logps.float() - ref_rejected_logps.float()  # (B,)
    loss = -F.logsigmoid(beta * (chosen_logratios - rejected_logratios)).mean()
    return loss, beta * chosen_logratios.detach(), beta * rejected_logratios.detach()


def pair_logprobs(model: nn.Module, pairs: Sequence[Preference]) -> tuple[Tensor, Tensor]:
    """``log p(chosen | prompt)`` and ``log p(rejected | prompt)`` under ``model``, each ``(B,)``,
    from one forward pass over the 2B rows (gradients flow unless called under ``no_grad``)."""
    if len(pairs) == 0:
        raise ValueError("need at least one pair, got an empty list")
    prompts = [p.prompt for p in pairs]
    device = next(model.parameters()).device
    idx, mask = pack(prompts + prompts, [p.chosen for p in pairs] + [p.rejected for p in pairs],
                     device=device)  # (2B, S), (2B, S)
    logps = sequence_logprobs(model(idx)[0], idx, mask)  # (2B, S, V) -> (2B,)
    return logps[:len(pairs)], logps[len(pairs):]  # (2B,) -> (B,), (B,)


def train_dpo(policy: nn.Module, ref: nn.Module, pairs: Sequence[Preference], config: TrainConfig,
              beta: float = 0.1, *, progress: bool = True) -> dict[str, list[float]]:
    """DPO (chapter 09): fit ``policy`` in place to ``pairs`` against the frozen ``ref`` with
    :func:`dpo_loss`, using :func:`course_lib.rlhf.sft.fit`. Returns per-step ``loss``,
    ``accuracy`` (fraction of the batch with chosen reward > rejected reward) and ``margin``
    (mean chosen minus rejected reward)."""
    if not beta > 0:
        raise ValueError(f"beta must be > 0, got {beta!r}")

    def loss_fn(batch):
        policy_chosen, policy_rejected = pair_logprobs(policy, batch)  # (B,), (B,)
        with torch.no_grad():
            ref_chosen, ref_rejected = pair_logprobs(ref, batch)  # (B,), (B,)
        loss, chosen, rejected = dpo_loss(policy_chosen, policy_rejected, ref_chosen, ref_rejected, beta)
        return loss, {"accuracy": (chosen > rejected).float().mean().item(),
                      "margin": (chosen - rejected).mean().item()}

    return fit(policy, pairs, loss_fn, config, progress=progress, desc="dpo")
