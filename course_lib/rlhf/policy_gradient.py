"""Policy optimisation against a reward with a KL leash: REINFORCE with a group-mean baseline and
a KL penalty (chapter 09).

Shapes: ``B = G * N`` rows, ``G`` groups (one prompt each), ``N`` samples per group, ``S``
positions.

The objective is InstructGPT's (Ouyang et al., 2022): maximise the reward while staying close
to a frozen reference policy (the SFT model)::

    max   E_{x, y ~ pi(.|x)} [ r(x, y) ]  -  beta * KL( pi(.|x) || pi_ref(.|x) )

The reward ``r`` is a learned reward model (RLHF: ``RewardModel.score``) or a program that
checks the answer (RL with verifiable rewards: ``verifier(task.check)``). One step of
:func:`rl_step`::

    prompts x_1 .. x_G, each N times  --sample, no gradient-->  y_gn ~ pi(.|x_g), cut after END
    r_gn = reward_fn(x_g, y_gn)                  one number per response
    A_gn = r_gn - mean_n r_gn                    group baseline (/ std_n r_gn if scale_by_std)
    logp_gn = sum_t log pi(y_t | x, y_<t)         with gradient: sequence_logprobs
    kl_gn   = sum_t k3(pi, pi_ref)(y_t)          with gradient: kl_estimate
    loss = mean_gn( -A_gn * logp_gn + beta * kl_gn )             one AdamW step

    pretrain --> SFT --> reward model --> RL (this module) ------> policy
                  |                        ^ KL leash to the SFT copy
                  +--------> DPO (course_lib.rlhf.dpo: no reward model, no sampling)

This is **REINFORCE with a group-mean baseline and a KL penalty**, not PPO and not GRPO. The
gradient of ``-A logp`` is Williams' (1992) REINFORCE estimator; subtracting the mean reward
of the prompt's group lowers its variance, as in GRPO (Shao et al., 2024, DeepSeekMath). The
mean includes the sample's own reward, which shrinks the expected gradient by the factor
``(N - 1) / N`` without turning it.

Simplifications against PPO (Schulman et al., 2017) as InstructGPT uses it: no value network
(the baseline is the group mean, so N >= 2); one gradient step per batch of samples, so they
always come from the current policy: no importance ratio pi / pi_old, no clipping of it, no
epochs over old samples; one reward per response at its end, no per-token rewards and no GAE;
the KL goes into the loss, not into the reward (InstructGPT subtracts ``beta log pi/pi_ref``
from the reward); no entropy bonus, no whitening of advantages across the batch.

Against GRPO: division by the group's standard deviation only with ``scale_by_std=True``
(GRPO always divides); no clipped ratio (it would be 1 with one step per batch); a response's
log-probability is summed over its tokens (true REINFORCE), where GRPO averages each response
over its tokens; like GRPO the KL is in the loss with the k3 estimator, but summed over the
response's tokens (a sequence KL, in nats per response), where GRPO averages it.

The KL estimators (Schulman, 2020, "Approximating KL divergence"), with ``r = log pi_ref(y) -
log pi(y)`` at a token ``y ~ pi``: ``k1 = -r`` (unbiased, can be negative) and
``k3 = exp(r) - 1 - r`` (unbiased, >= 0, small variance when pi is near pi_ref). A note on
the gradient of k3 in the loss: at each visited prefix its expectation is the gradient of
KL(pi_ref || pi), the *other* direction; both vanish at pi = pi_ref and pull towards it, which
is all a leash needs (a test checks this). k1 in the loss would pull nowhere: its expected
gradient is 0. The samples are drawn at temperature 1, from the very policy whose
log-probabilities are differentiated.

Left out: PPO's clipping and value head, several epochs per batch, per-token KL in the reward,
reward normalisation, entropy bonuses, and batching of long generations.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn
from tqdm.auto import tqdm

from ..generation import generate, left_pad
from .sft import pack, token_ids, token_logprobs
from .tasks import END, decode, encode

__all__ = ["kl_estimate", "group_advantages", "reinforce_loss", "RLConfig", "verifier", "sample", "respond",
           "mean_reward", "rl_step", "train_rl", "plot_rl"]

RewardFn = Callable[[list, list], "Tensor | Sequence[float]"]  # (prompts, responses as text) -> (B,)


def kl_estimate(logp_policy: Tensor, logp_ref: Tensor, mask: Tensor, kind: str = "k3") -> Tensor:
    """Per-sequence estimates of KL(policy || ref) from the log-probabilities of tokens sampled
    from the policy (chapter 09): a per-token estimator summed over ``mask``,
    ``(B, S), (B, S), (B, S) bool -> (B,)``, in nats per sequence.

    ``r = logp_ref - logp_policy``; ``kind="k1"``: ``-r``; ``kind="k3"``: ``exp(r) - 1 - r``.

    >>> logp, ref = torch.tensor([[-1.0, -2.0]]), torch.tensor([[-1.5, -2.0]])
    >>> kl_estimate(logp, ref, torch.tensor([[True, True]]), kind="k1")          # 0.5 + 0
    tensor([0.5000])
    >>> round(kl_estimate(logp, ref, torch.tensor([[True, False]])).item(), 4)   # e^-0.5 - 1 + 0.5
    0.1065
    """
    if kind not in ("k1", "k3"):
        raise ValueError(f"kind must be 'k1' or 'k3', got {kind!r}")
    if logp_policy.shape != logp_ref.shape or mask.shape != logp_policy.shape or logp_policy.dim() != 2:
        raise ValueError(f"logp_policy, logp_ref and mask must all be (B, S), got shapes "
                         f"{tuple(logp_policy.shape)}, {tuple(logp_ref.shape)}, {tuple(mask.shape)}")
    if mask.dtype != torch.bool:
        raise ValueError(f"mask must be a bool tensor, got dtype {mask.dtype}")
    # r = 0 off the mask, before exp: an inf there would turn into NaN (inf * 0) in the gradient
    r = torch.where(mask, logp_ref.float() - logp_policy.float(), 0.0)  # (B, S)
    per_token = -r if kind == "k1" else torch.expm1(r) - r  # (B, S); both 0 where r = 0
    return per_token.sum(-1)  # (B, S) -> (B,)


def group_advantages(rewards: Tensor, scale_by_std: bool = False, eps: float = 1e-6) -> Tensor:
    """Rewards minus their group's mean, ``(G, N) -> (G, N)`` (chapter 09); with ``scale_by_std``
    (GRPO) also divided by the group's standard deviation (``N - 1`` in the denominator) plus
    ``eps``. A group whose rewards are all equal gets zeros: it carries no signal.

    >>> group_advantages(torch.tensor([[1.0, 0.0, 0.0, 1.0], [2.0, 2.0, 2.0, 2.0]]))
    tensor([[ 0.5000, -0.5000, -0.5000,  0.5000],
            [ 0.0000,  0.0000,  0.0000,  0.0000]])
    """
    if rewards.dim() != 2 or rewards.shape[1] < 2:
        raise ValueError(f"rewards must be (G, N) with N >= 2 samples per group (the baseline is the "
                         f"group's mean), got shape {tuple(rewards.shape)}")
    if not eps > 0:
        raise ValueError(f"eps must be > 0, got {eps!r}")
    rewards = rewards.float()
    centred = rewards - rewards.mean(dim=1, keepdim=True)  # (G, N) - (G, 1)
    if scale_by_std:
        centred = centred / (rewards.std(dim=1, keepdim=True) + eps)  # (G, N) / (G, 1)
    return centred


def reinforce_loss(logp_seq: Tensor, advantages: Tensor, kl: Tensor, beta: float) -> Tensor:
    """``mean_b( -advantages[b] * logp_seq[b] + beta * kl[b] )``, ``(B,), (B,), (B,) -> ()``
    (chapter 09). The advantages are constants (detached); gradients flow through ``logp_seq``
    and ``kl``.

    >>> reinforce_loss(torch.tensor([-1.0, -2.0]), torch.tensor([1.0, -1.0]), torch.tensor([0.2, 0.4]), 0.5)
    tensor(-0.3500)
    """
    if beta < 0:
        raise ValueError(f"beta must be >= 0, got {beta!r}")
    if logp_seq.dim() != 1 or advantages.shape != logp_seq.shape or kl.shape != logp_seq.shape:
        raise ValueError(f"logp_seq, advantages and kl must all be (B,), got shapes {tuple(logp_seq.shape)}, "
                         f"{tuple(advantages.shape)}, {tuple(kl.shape)}")
    return (-advantages.detach() * logp_seq + beta * kl).mean()


@dataclass(frozen=True)
class RLConfig:
    """How :func:`train_rl` optimises a policy (chapter 09). Defaults: a tiny policy on a CPU in seconds.

    >>> RLConfig(group_size=4).rows_per_step
    32
    """

    steps: int = 50               # optimizer updates; one fresh batch of samples each
    prompts_per_step: int = 8     # G prompts per step, drawn with replacement from the pool
    group_size: int = 8           # N samples per prompt; the baseline is their mean, so N >= 2
    max_new_tokens: int = 8       # a response stops at END or after this many tokens
    beta: float = 0.1             # weight of the KL penalty (the leash); 0 = no leash
    lr: float = 3e-4              # AdamW, constant, no weight decay (1e-3 can wreck an SFT model)
    scale_by_std: bool = False    # GRPO divides the advantages by the group's standard deviation
    grad_clip: float | None = 1.0  # clip the gradient's global L2 norm; None = no clipping
    seed: int = 0                 # seeds the prompt draws and the sampling

    def __post_init__(self):
        for name in ("steps", "prompts_per_step", "max_new_tokens"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        if isinstance(self.group_size, bool) or not isinstance(self.group_size, int) or self.group_size < 2:
            raise ValueError(f"group_size must be an int >= 2 (the baseline is the mean of a group), "
                             f"got {self.group_size!r}")
        if not self.beta >= 0:
            raise ValueError(f"beta must be >= 0, got {self.beta!r}")
        if not self.lr > 0:
            raise ValueError(f"lr must be > 0, got {self.lr!r}")
        if self.grad_clip is not None and not self.grad_clip > 0:
            raise ValueError(f"grad_clip must be > 0 or None, got {self.grad_clip!r}")

    @property
    def rows_per_step(self) -> int:
        """B = G * N sampled responses per step."""
        return self.prompts_per_step * self.group_size


def verifier(check: Callable[[str, str], float]) -> RewardFn:
    """A reward function from a per-response checker ``check(prompt, response) -> float``, such
    as ``task.check`` (or the flawed ``task.check_format``).

    >>> from course_lib.rlhf.tasks import AdditionTask
    >>> verifier(AdditionTask().check)(["3+4=", "3+4="], ["7\\n", "8\\n"])
    tensor([1., 0.])
    """
    def reward_fn(prompts, responses) -> Tensor:
        return torch.tensor([float(check(p, r)) for p, r in zip(prompts, responses, strict=True)])
    return reward_fn


def _check_prompts(prompts, model: nn.Module, max_new_tokens: int) -> list[list[int]]:
    if len(prompts) == 0:
        raise ValueError("need at least one prompt, got an empty list")
    ids = [token_ids(p) for p in prompts]
    longest, C = max(len(p) for p in ids), model.config.context_length
    if longest + max_new_tokens > C:
        raise ValueError(f"the longest prompt ({longest} tokens) + max_new_tokens={max_new_tokens} exceeds "
                         f"the model's context_length={C}")
    return ids


def sample(policy: nn.Module, prompts: Sequence, max_new_tokens: int, *, temperature: float = 1.0,
           generator: torch.Generator | None = None) -> list[list[int]]:
    """One response per prompt (a str or token ids) -> the response token ids, each cut after
    its first END (kept) or at ``max_new_tokens``. Prompts are left-padded into one batch
    (:func:`course_lib.generation.left_pad`, with a KV cache); ``temperature=0`` is greedy."""
    ids = _check_prompts(prompts, policy, max_new_tokens)
    device = next(policy.parameters()).device
    end = encode(END)[0]
    idx, padding_mask = left_pad([torch.tensor(p, device=device) for p in ids])  # (B, S), (B, S)
    out = generate(policy, idx, max_new_tokens, temperature=temperature, stop_tokens=[end],
                   generator=generator, padding_mask=padding_mask)  # (B, S) -> (B, S + n)
    responses = []
    for row in out[:, idx.shape[1]:].tolist():  # the new tokens of each row
        responses.append(row[:row.index(end) + 1] if end in row else row)
    return responses


def respond(policy: nn.Module, prompts: Sequence, max_new_tokens: int = 8, *, temperature: float = 0.0,
            generator: torch.Generator | None = None) -> list[str]:
    """The policy's responses as text (greedy by default): for looking at what it does."""
    return [decode(r) for r in sample(policy, prompts, max_new_tokens, temperature=temperature,
                                      generator=generator)]


def mean_reward(policy: nn.Module, prompts: Sequence[str], reward_fn: RewardFn, max_new_tokens: int = 8, *,
                temperature: float = 0.0, generator: torch.Generator | None = None) -> float:
    """The mean reward of the policy's responses to ``prompts`` (greedy by default), e.g. the
    accuracy on held-out prompts with ``reward_fn=verifier(task.check)``."""
    responses = respond(policy, prompts, max_new_tokens, temperature=temperature, generator=generator)
    return torch.as_tensor(reward_fn(list(prompts), responses), dtype=torch.float).mean().item()


def rl_step(policy: nn.Module, ref: nn.Module, optimizer: torch.optim.Optimizer, prompts: Sequence[str],
            reward_fn: RewardFn, config: RLConfig, *, generator: torch.Generator | None = None,
            metrics: dict[str, RewardFn] | None = None) -> dict[str, float]:
    """One update of ``policy`` (drawn in the module docstring): ``config.group_size`` samples
    for each of the G ``prompts``, rewards, group advantages, the loss
    :func:`reinforce_loss` with ``kl_estimate(kind="k3")`` and ``config.beta``, one optimizer step.

    Returns the batch's ``reward`` (mean), ``kl`` (mean over responses of the k3 sequence KL,
    nats), ``loss``, ``length`` (mean response tokens) and the mean of each extra reward
    function in ``metrics`` on the same responses (for instance the true checker while
    optimising a flawed one). All are measured *before* the update.
    """
    if len(prompts) == 0:
        raise ValueError("rl_step needs at least one prompt, got an empty list")
    G, N = len(prompts), config.group_size
    texts = [p for p in prompts for _ in range(N)]  # (B,) rows, group-major: row g * N + n
    prompt_ids = _check_prompts(texts, policy, config.max_new_tokens)
    response_ids = sample(policy, prompt_ids, config.max_new_tokens, generator=generator)
    responses = [decode(r) for r in response_ids]
    device = next(policy.parameters()).device
    rewards = torch.as_tensor(reward_fn(texts, responses), dtype=torch.float).to(device)  # (B,)
    if rewards.shape != (G * N,):
        raise ValueError(f"reward_fn must return one reward per response, shape ({G * N},), "
                         f"got {tuple(rewards.shape)}")
    advantages = group_advantages(rewards.view(G, N), config.scale_by_std).flatten()  # (G, N) -> (B,)

    idx, mask = pack(prompt_ids, response_ids, device=device)  # (B, S), (B, S) response tokens
    policy.train()
    logits, _ = policy(idx)  # (B, S) -> (B, S, V)
    logp = token_logprobs(logits, idx)  # (B, S)
    with torch.no_grad():
        logp_ref = token_logprobs(ref(idx)[0], idx)  # (B, S)
    kl = kl_estimate(logp, logp_ref, mask, kind="k3")  # (B,)
    logp_seq = (logp * mask).sum(-1)  # (B, S) -> (B,): sequence_logprobs, reusing logp
    loss = reinforce_loss(logp_seq, advantages, kl, config.beta)

    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    if config.grad_clip is not None:
        nn.utils.clip_grad_norm_([p for p in policy.parameters() if p.requires_grad], config.grad_clip)
    optimizer.step()
    stats = {"reward": rewards.mean().item(), "kl": kl.mean().item(), "loss": loss.item(),
             "length": mask.sum(-1).float().mean().item()}
    for name, fn in (metrics or {}).items():
        stats[name] = torch.as_tensor(fn(texts, responses), dtype=torch.float).mean().item()
    return stats


def train_rl(policy: nn.Module, ref: nn.Module, prompts: Sequence[str], reward_fn: RewardFn, config: RLConfig,
             *, metrics: dict[str, RewardFn] | None = None, progress: bool = True) -> dict[str, list[float]]:
    """``config.steps`` calls of :func:`rl_step` on ``policy`` (in place), each on
    ``config.prompts_per_step`` prompts drawn from ``prompts``, with AdamW on the trainable
    parameters (so a LoRA-adapted policy trains its adapters only). ``ref`` is the frozen
    reference (:func:`course_lib.rlhf.sft.frozen_copy` of the starting policy).

    Returns ``{"step", "reward", "kl", "loss", "length", *metrics}``, one entry per step, measured
    before that step's update (so ``kl[0]`` is 0 when the policy starts as ``ref``).
    """
    if len(prompts) == 0:
        raise ValueError("train_rl needs at least one prompt, got an empty list")
    device = next(policy.parameters()).device
    optimizer = torch.optim.AdamW([p for p in policy.parameters() if p.requires_grad], lr=config.lr,
                                  weight_decay=0.0)
    draws = torch.Generator().manual_seed(config.seed)  # which prompts
    sampling = torch.Generator(device=device).manual_seed(config.seed)  # which responses
    history: dict[str, list[float]] = {"step": []}
    bar = tqdm(range(config.steps), desc="rl", disable=not progress)
    for step in bar:
        picks = torch.randint(len(prompts), (config.prompts_per_step,), generator=draws).tolist()
        stats = rl_step(policy, ref, optimizer, [prompts[i] for i in picks], reward_fn, config,
                        generator=sampling, metrics=metrics)
        history["step"].append(step)
        for key, value in stats.items():
            history.setdefault(key, []).append(value)
        bar.set_postfix(reward=f"{stats['reward']:.3f}", kl=f"{stats['kl']:.3f}")
    return history


def plot_rl(history: dict[str, list[float]], keys: Sequence[str] = ("reward",), axes=None):
    """Two panels against the step: the rewards named by ``keys`` (e.g. ``("reward", "correct")``)
    and the KL to the reference. Returns the two matplotlib Axes."""
    import matplotlib.pyplot as plt  # here, not at import: importing course_lib draws nothing

    if axes is None:
        _, axes = plt.subplots(1, 2, figsize=(9, 3.2))
    for key in keys:
        axes[0].plot(history["step"], history[key], label=key)
    axes[0].set_xlabel("step")
    axes[0].set_ylabel("mean reward of the batch")
    axes[0].legend()
    axes[1].plot(history["step"], history["kl"], color="C3")
    axes[1].set_xlabel("step")
    axes[1].set_ylabel("KL(policy || ref), nats per response")
    return axes
