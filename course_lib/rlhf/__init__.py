"""RLHF, DPO and RL with verifiable rewards, small enough for a CPU (chapter 09).

The pipeline of Ouyang et al. (2022, InstructGPT), and the two shortcuts the chapter adds::

    pretrained GPT --SFT--> policy --RL against a reward, KL leash to the SFT copy--> aligned policy
                             |   ^
          human pairs --Bradley-Terry--> reward model        (RLHF)
          human pairs --DPO, no reward model, no sampling--> aligned policy   (Rafailov et al., 2023)
          a program that checks answers --as the reward--> (RL with verifiable rewards)

The package, read in this order:

* ``tasks``: data made by code, offline and seeded: verifiable tasks (:class:`AdditionTask`,
  :class:`SortTask`) with an exact checker and a flawed one that looks at the format only, and
  a rule-based human's preference pairs (:class:`PreferenceTask`);
* ``sft``: a batch of prompt + response rows, the response mask, token and sequence
  log-probabilities (the pure functions every method uses), SFT on demonstrations, and the
  small training loop :func:`fit`;
* ``reward``: the Bradley-Terry loss and a :class:`RewardModel` (a GPT body with a scalar head);
* ``policy_gradient``: REINFORCE with a group-mean baseline and a KL penalty (not PPO, not
  GRPO: its docstring lists the differences), KL estimators, group advantages, sampling;
* ``dpo``: the DPO loss and its training loop.

Shapes: ``B`` batch, ``S`` positions, ``V`` vocabulary, ``D`` d_model, ``G`` groups (prompts),
``N`` samples per group. Text is bytes (vocabulary 256); a response ends with
:data:`tasks.END`, a newline.
"""

from .dpo import dpo_loss, pair_logprobs, train_dpo
from .policy_gradient import (
    RLConfig,
    group_advantages,
    kl_estimate,
    mean_reward,
    plot_rl,
    reinforce_loss,
    respond,
    rl_step,
    sample,
    train_rl,
    verifier,
)
from .reward import RewardModel, bradley_terry_loss, last_hidden, pairwise_accuracy, train_reward_model
from .sft import (
    fit,
    frozen_copy,
    pack,
    response_loss,
    response_mask,
    sequence_logprobs,
    sft_batch,
    supervised_finetune,
    token_ids,
    token_logprobs,
)
from .tasks import END, AdditionTask, Preference, PreferenceTask, SortTask, Task, decode, encode

__all__ = ["END", "encode", "decode", "Task", "AdditionTask", "SortTask", "Preference", "PreferenceTask",
           "token_ids", "response_mask", "pack", "token_logprobs", "sequence_logprobs", "sft_batch", "fit",
           "frozen_copy", "supervised_finetune", "response_loss",
           "bradley_terry_loss", "last_hidden", "RewardModel", "train_reward_model", "pairwise_accuracy",
           "kl_estimate", "group_advantages", "reinforce_loss", "RLConfig", "verifier", "sample", "respond",
           "mean_reward", "rl_step", "train_rl", "plot_rl",
           "dpo_loss", "pair_logprobs", "train_dpo"]
