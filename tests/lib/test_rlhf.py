"""Tests for course_lib.rlhf (tasks, sft, reward, policy_gradient, dpo).

Oracles: ``F.cross_entropy`` for token log-probabilities, GPT's own loss for the SFT loss,
exact KL divergences of small categorical distributions for the Monte Carlo estimators (and
exact expected gradients by enumeration), ``softplus`` and the Bradley-Terry loss for DPO.
Hand-worked: log-probabilities, masks, the DPO and Bradley-Terry losses, checkers. Properties:
masked tokens change nothing, a padded row equals the row alone, group advantages have zero
mean, DPO's optimum matches the data's log-odds. Learning: SFT lowers the response loss, a
reward model learns the rule, RL raises the reward, a large beta holds the policy near the
reference. All tiny, seeded, fp32.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn.functional as F

from course_lib import rlhf
from course_lib.model import GPT, ModelConfig
from course_lib.rlhf import dpo, policy_gradient, reward, sft, tasks
from course_lib.train import TrainConfig

TINY = ModelConfig(vocab_size=256, context_length=24, d_model=32, n_layers=1, n_heads=2)
DIGITS = [("n=", f"{d}\n") for d in range(10)] * 10  # a uniform digit, then END
SEVEN = policy_gradient.verifier(lambda prompt, response: float(response == "7\n"))


def _model(seed: int = 0, config: ModelConfig = TINY) -> GPT:
    torch.manual_seed(seed)
    return GPT(config)


def _trainable_copy(model: GPT) -> GPT:
    out = copy.deepcopy(model).train()
    for p in out.parameters():
        p.requires_grad_(True)
    return out


@pytest.fixture(scope="module")
def digit_policy() -> GPT:
    """A tiny GPT fine-tuned to answer "n=" with one digit, uniformly, then END."""
    model = _model()
    sft.supervised_finetune(model, DIGITS, TrainConfig(max_steps=40, batch_size=32, lr=1e-2, warmup_steps=5,
                                                       min_lr=1e-3), progress=False)
    return model


def _first_token_probs(model: GPT, prompt: str = "n=") -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([tasks.encode(prompt)]))[0][0, -1].softmax(-1)  # (V,)


# --------------------------------------------------------------------------- tasks
def test_addition_checkers_by_hand():
    task = tasks.AdditionTask(max_operand=20)
    assert task.solve("12+7=") == "19"
    assert task.check("12+7=", "19\n") == 1.0
    for wrong in ("18\n", "19", "19\n\n", " 19\n", "019\n", "1 9\n", "x\n", ""):  # wrong or malformed
        assert task.check("12+7=", wrong) == 0.0, wrong
    # the flawed checker: right form, wrong answer still scores; wrong form does not
    assert task.check_format("12+7=", "18\n") == 1.0 and task.check_format("12+7=", "019\n") == 1.0
    for bad in ("19", "1 9\n", "x\n", "\n", "19.\n"):
        assert task.check_format("12+7=", bad) == 0.0, bad
    with pytest.raises(ValueError, match="addition prompt"):
        task.solve("12*7=")


def test_sort_checkers_by_hand():
    task = tasks.SortTask(length=3, alphabet="abc")
    assert task.solve("cab>") == "abc" and task.check("cab>", "abc\n") == 1.0
    for wrong in ("acb\n", "abc", "aab\n", "abcc\n"):
        assert task.check("cab>", wrong) == 0.0, wrong
    assert task.check_format("cab>", "aaa\n") == 1.0  # sorted-looking, not the prompt's letters
    assert task.check_format("cab>", "cba\n") == 0.0 and task.check_format("cab>", "abc") == 0.0


def test_demonstrations_pass_the_checker_and_everything_is_seeded():
    for task in (tasks.AdditionTask(), tasks.SortTask()):
        demos = task.demonstrations(20, seed=1)
        assert all(task.check(p, r) == 1.0 for p, r in demos)
        assert task.prompts(20, seed=1) == [p for p, _ in demos]
        assert task.prompts(20, seed=1) == task.prompts(20, seed=1) != task.prompts(20, seed=2)


def test_preference_pairs_follow_the_rule_and_the_seed():
    task = tasks.PreferenceTask()
    assert task.score("tea:", "kind good dull\n") == 1.0  # 2 kind - 1 unkind
    assert task.score("tea:", "bad rude\n") == -2.0 and task.score("tea:", "kind good") == 0.0  # unfinished
    pairs = task.pairs(100, seed=3)
    assert pairs == task.pairs(100, seed=3) != task.pairs(100, seed=4)
    assert all(task.score(p.prompt, p.chosen) > task.score(p.prompt, p.rejected) for p in pairs)
    assert all(p.prompt[:-1] in task.topics and p.chosen.endswith(tasks.END) for p in pairs)
    assert len({p.chosen for p in pairs}) > 20  # not one pair repeated


def test_task_bad_input():
    with pytest.raises(ValueError, match="max_operand"):
        tasks.AdditionTask(max_operand=0)
    with pytest.raises(ValueError, match="alphabet"):
        tasks.SortTask(alphabet="aB")
    with pytest.raises(ValueError, match="both kind and unkind"):
        tasks.PreferenceTask(kind=("good",), unkind=("good",))
    with pytest.raises(ValueError, match="n must be"):
        tasks.AdditionTask().prompts(0)
    with pytest.raises(ValueError, match="n must be"):
        tasks.PreferenceTask().pairs(-1)


# --------------------------------------------------------------------------- masks and log-probabilities
def test_response_mask_and_pack_by_hand():
    mask = sft.response_mask(torch.tensor([2, 1, 3]), torch.tensor([4, 2, 3]), 5)
    assert mask.int().tolist() == [[0, 0, 1, 1, 0], [0, 1, 0, 0, 0], [0, 0, 0, 0, 0]]
    idx, mask = sft.pack(["ab", "c"], ["d\n", [7]], pad_id=0)
    assert idx.tolist() == [[97, 98, 100, 10], [99, 7, 0, 0]]
    assert mask.int().tolist() == [[0, 0, 1, 1], [0, 1, 0, 0]]


def test_token_logprobs_by_hand():
    """V = 3, logits per position; token t is scored by the logits at t - 1:
    t = 1: logits (0, 0, ln 2) -> probs (1/4, 1/4, 1/2), token 2 -> ln(1/2)
    t = 2: logits (ln 3, 0, 0)  -> probs (3/5, 1/5, 1/5), token 0 -> ln(3/5)
    (the logits at t = 2 predict nothing inside the row; t = 0 gets 0)."""
    logits = torch.tensor([[[0.0, 0.0, math.log(2)], [math.log(3), 0.0, 0.0], [9.0, -9.0, 0.0]]])
    tokens = torch.tensor([[1, 2, 0]])
    expected = torch.tensor([[0.0, math.log(1 / 2), math.log(3 / 5)]])
    torch.testing.assert_close(sft.token_logprobs(logits, tokens), expected)
    mask = torch.tensor([[False, False, True]])
    torch.testing.assert_close(sft.sequence_logprobs(logits, tokens, mask), torch.tensor([math.log(3 / 5)]))


def test_token_logprobs_equal_cross_entropy():
    g = torch.Generator().manual_seed(0)
    logits, tokens = torch.randn(3, 6, 11, generator=g), torch.randint(0, 11, (3, 6), generator=g)
    ce = F.cross_entropy(logits[:, :-1].reshape(-1, 11), tokens[:, 1:].reshape(-1), reduction="none")
    out = sft.token_logprobs(logits, tokens)
    torch.testing.assert_close(out[:, 1:], -ce.view(3, 5))
    assert torch.equal(out[:, 0], torch.zeros(3))


def test_masked_positions_change_nothing():
    g = torch.Generator().manual_seed(0)
    logits, tokens = torch.randn(2, 6, 9, generator=g), torch.randint(0, 9, (2, 6), generator=g)
    mask = sft.response_mask(torch.tensor([2, 3]), torch.tensor([4, 6]), 6)
    base = sft.sequence_logprobs(logits, tokens, mask)
    for b, t in [(0, 1), (0, 4), (0, 5), (1, 2)]:  # tokens outside the mask: prompt or padding
        changed_logits = logits.clone()
        changed_logits[b, t - 1] += 5.0 * torch.randn(9, generator=g)  # the logits that predict token t
        changed_tokens = tokens.clone()
        changed_tokens[b, t] = (tokens[b, t] + 1) % 9
        torch.testing.assert_close(sft.sequence_logprobs(changed_logits, tokens, mask), base)
        torch.testing.assert_close(sft.sequence_logprobs(logits, changed_tokens, mask), base)
    changed = logits.clone()
    changed[0, 2, tokens[0, 3]] += 1.0  # predicts token 3, a response token: counts
    assert not torch.allclose(sft.sequence_logprobs(changed, tokens, mask)[0], base[0])


def test_padded_rows_equal_rows_alone():
    """Right padding in pack: a causal model's log-probabilities of a row do not depend on what
    follows it, so the batch gives each row's value alone, whatever the pad id."""
    model = _model().eval()
    prompts, responses = ["tea:", "a", "song:"], ["kind good\n", "xy\n", "no\n"]
    with torch.no_grad():
        batch = []
        for pad_id in (0, 200):
            idx, mask = sft.pack(prompts, responses, pad_id=pad_id)
            batch.append(sft.sequence_logprobs(model(idx)[0], idx, mask))
        torch.testing.assert_close(batch[0], batch[1])
        for b, (p, r) in enumerate(zip(prompts, responses, strict=True)):
            idx, mask = sft.pack([p], [r])
            torch.testing.assert_close(batch[0][b], sft.sequence_logprobs(model(idx)[0], idx, mask)[0])


def test_sample_left_padded_batch_equals_rows_alone():
    model = _model(seed=1).eval()
    prompts = ["a", "tea:", "xy"]
    together = policy_gradient.sample(model, prompts, 5, temperature=0.0)
    alone = [policy_gradient.sample(model, [p], 5, temperature=0.0)[0] for p in prompts]
    assert together == alone
    assert all(len(r) <= 5 for r in together)


def test_sample_cuts_after_the_first_end(digit_policy):
    g = torch.Generator().manual_seed(0)
    responses = policy_gradient.sample(digit_policy, ["n="] * 16, 6, generator=g)
    end = tasks.encode(tasks.END)[0]
    for r in responses:
        assert end not in r[:-1] and (r[-1] == end or len(r) == 6)


def test_sequence_bad_input():
    logits, tokens = torch.zeros(2, 4, 5), torch.zeros(2, 4, dtype=torch.long)
    with pytest.raises(ValueError, match=r"mask\[:, 0\] must be False"):
        sft.sequence_logprobs(logits, tokens, torch.ones(2, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match="mask must be a bool tensor"):
        sft.sequence_logprobs(logits, tokens, torch.zeros(2, 3, dtype=torch.bool))
    with pytest.raises(ValueError, match="logits must be"):
        sft.token_logprobs(logits, tokens[:, :3])
    with pytest.raises(ValueError, match="every prompt needs >= 1 token"):
        sft.response_mask(torch.tensor([0, 1]), torch.tensor([2, 2]), 4)
    with pytest.raises(ValueError, match="total_lengths <= S"):
        sft.response_mask(torch.tensor([1, 1]), torch.tensor([2, 5]), 4)
    with pytest.raises(ValueError, match="as many responses as prompts"):
        sft.pack(["a", "b"], ["c\n"])
    with pytest.raises(ValueError, match="empty response"):
        sft.sft_batch(["a"], [""])


# --------------------------------------------------------------------------- SFT
def test_sft_batch_by_hand_and_its_loss_is_the_response_logprob():
    idx, targets = sft.sft_batch(["3+4=", "1+1="], ["7\n", "12\n"])
    assert idx.tolist() == [[51, 43, 52, 61, 55, 10], [49, 43, 49, 61, 49, 50]]
    assert targets.tolist() == [[-100, -100, -100, 55, 10, -100], [-100, -100, -100, 49, 50, 10]]
    # two roads to the same number: GPT's cross-entropy on the targets, and -sum log p(response)
    model = _model().eval()
    with torch.no_grad():
        loss = model(idx, targets)[1]
        full, mask = sft.pack(["3+4=", "1+1="], ["7\n", "12\n"])
        logps = sft.sequence_logprobs(model(full)[0], full, mask)
    torch.testing.assert_close(loss, -logps.sum() / mask.sum())
    torch.testing.assert_close(sft.response_loss(model, [("3+4=", "7\n"), ("1+1=", "12\n")]), loss.item())


def test_sft_lowers_the_response_loss(digit_policy):
    """Demonstrations: a uniform digit then END, so the best loss is (ln 10 + 0) / 2 = 1.15 nats."""
    before, after = sft.response_loss(_model(), DIGITS), sft.response_loss(digit_policy, DIGITS)
    assert before > 5.0 and after < 1.6
    probs = _first_token_probs(digit_policy)[tasks.encode("0123456789")]
    assert probs.sum() > 0.9 and probs.min() > 0.05  # digits, and not one digit only


def test_fit_bad_input():
    with pytest.raises(ValueError, match="at least one example"):
        sft.fit(_model(), [], lambda batch: None, TrainConfig())


# --------------------------------------------------------------------------- reward model
def test_bradley_terry_by_hand_and_against_the_logistic():
    """r_chosen - r_rejected = (2, 0): -log sigmoid(2) = log(1 + e^-2) = log 1.1353353 = 0.1269280,
    -log sigmoid(0) = log 2 = 0.6931472; mean 0.4100376."""
    loss = reward.bradley_terry_loss(torch.tensor([2.0, 0.0]), torch.tensor([0.0, 0.0]))
    assert loss.item() == pytest.approx(0.4100376, abs=1e-6)
    g = torch.Generator().manual_seed(0)
    rc, rr = 3 * torch.randn(50, generator=g), 3 * torch.randn(50, generator=g)
    logistic = 1 / (1 + torch.exp(-(rc - rr)))  # P(chosen preferred)
    torch.testing.assert_close(reward.bradley_terry_loss(rc, rr), -logistic.log().mean())
    shifted = reward.bradley_terry_loss(rc + 7.0, rr + 7.0)  # only differences count
    torch.testing.assert_close(shifted, reward.bradley_terry_loss(rc, rr))


def test_last_hidden_is_what_the_lm_head_reads():
    model = _model().eval()
    idx = torch.tensor([tasks.encode("tea:kind\n")])
    with torch.no_grad():
        torch.testing.assert_close(model.lm_head(reward.last_hidden(model, idx)), model(idx)[0])
    post = GPT(ModelConfig(vocab_size=256, context_length=8, d_model=16, n_heads=2, norm_position="post"))
    assert reward.last_hidden(post, idx[:, :8]).shape == (1, 8, 16)


def test_reward_model_reads_the_last_real_token():
    torch.manual_seed(0)
    rm = reward.RewardModel(_model())
    prompts, responses = ["tea:", "cat:"], ["kind\n", "dull good nice\n"]
    together = rm.score(prompts, responses)
    alone = torch.cat([rm.score([p], [r]) for p, r in zip(prompts, responses, strict=True)])
    torch.testing.assert_close(together, alone)
    assert together[0] != together[1]
    with pytest.raises(ValueError, match="lengths must be"):
        rm(torch.zeros(2, 4, dtype=torch.long), torch.tensor([0, 4]))
    with pytest.raises(TypeError, match="course_lib GPT"):
        reward.RewardModel(torch.nn.Linear(2, 2))


def test_reward_model_learns_the_rule():
    task = tasks.PreferenceTask()
    train_pairs, held_out = task.pairs(512, seed=0), task.pairs(200, seed=1)
    torch.manual_seed(0)
    rm = reward.RewardModel(_model())
    config = TrainConfig(max_steps=40, batch_size=32, lr=3e-3, warmup_steps=5, min_lr=3e-4)
    history = reward.train_reward_model(rm, train_pairs, config, progress=False)
    assert len(history["loss"]) == 40 and history["loss"][-1] < history["loss"][0]
    assert reward.pairwise_accuracy(rm, held_out) > 0.85  # chance is 0.5; measured 0.965
    assert rm.training  # the mode is restored


# --------------------------------------------------------------------------- KL, advantages, loss
P = torch.tensor([0.5, 0.2, 0.1, 0.1, 0.1])
Q = torch.tensor([0.1, 0.3, 0.2, 0.3, 0.1])


@pytest.mark.parametrize("kind", ["k1", "k3"])
def test_kl_estimators_are_unbiased(kind):
    exact = (P * (P / Q).log()).sum()  # KL(P || Q) = 0.3993...
    M = 100_000
    x = torch.multinomial(P, M, replacement=True, generator=torch.Generator().manual_seed(0))  # (M,) ~ P
    logp, logq = P.log()[x][:, None], Q.log()[x][:, None]  # (M, 1): one-token sequences
    est = policy_gradient.kl_estimate(logp, logq, torch.ones(M, 1, dtype=torch.bool), kind=kind)  # (M,)
    assert abs(est.mean() - exact) < 5 * est.std() / math.sqrt(M)
    if kind == "k3":
        assert (est >= 0).all()
    else:
        assert (est < 0).any()  # k1 is unbiased, not non-negative


def test_kl_estimate_is_zero_at_the_reference_and_ignores_the_mask():
    g = torch.Generator().manual_seed(0)
    logp = torch.randn(3, 5, generator=g)
    mask = torch.tensor([[0, 1, 1, 0, 0], [0, 0, 1, 1, 1], [0, 0, 0, 0, 0]], dtype=torch.bool)
    for kind in ("k1", "k3"):
        assert torch.equal(policy_gradient.kl_estimate(logp, logp, mask, kind), torch.zeros(3))
    far = logp.masked_fill(~mask, float("-inf"))  # the reference forbids tokens off the mask: no inf, no NaN
    logp.requires_grad_(True)
    kl = policy_gradient.kl_estimate(logp, far, mask, "k3")
    kl.sum().backward()
    assert torch.isfinite(kl).all() and torch.isfinite(logp.grad).all() and kl[2] == 0
    # per token: k3 = e^r - 1 - r, summed over the row's mask
    r = (far - logp.detach())[0, 1:3]
    torch.testing.assert_close(kl[0], (r.exp() - 1 - r).sum())


def test_gradient_of_k3_in_the_loss_is_the_reverse_kl_gradient():
    """The docstring's claim, by exact expectation over the 5 outcomes: E_p[grad k3] = grad KL(q || p),
    and E_p[grad k1] = 0 (k1 in the loss would not pull at all)."""
    theta = torch.randn(5, generator=torch.Generator().manual_seed(0), requires_grad=True)
    logp = F.log_softmax(theta, -1)
    mask = torch.ones(5, 1, dtype=torch.bool)
    grads = {}
    for kind in ("k1", "k3"):
        per_outcome = policy_gradient.kl_estimate(logp[:, None], Q.log()[:, None], mask, kind)  # (5,)
        expected = (logp.exp().detach() * per_outcome).sum()  # sum_x p(x) k(x), p held fixed
        grads[kind], = torch.autograd.grad(expected, theta, retain_graph=True)
    reverse, = torch.autograd.grad((Q * (Q.log() - logp)).sum(), theta)
    torch.testing.assert_close(grads["k3"], reverse)
    torch.testing.assert_close(grads["k1"], torch.zeros(5), atol=1e-6, rtol=0)


def test_group_advantages():
    rewards = torch.tensor([[1.0, 0.0, 0.0, 1.0], [3.0, 1.0, 2.0, 2.0], [5.0, 5.0, 5.0, 5.0]])
    adv = policy_gradient.group_advantages(rewards)
    torch.testing.assert_close(adv[:2], torch.tensor([[0.5, -0.5, -0.5, 0.5], [1.0, -1.0, 0.0, 0.0]]))
    assert torch.equal(adv[2], torch.zeros(4))
    scaled = policy_gradient.group_advantages(rewards, scale_by_std=True)
    torch.testing.assert_close(scaled.mean(1), torch.zeros(3), atol=1e-6, rtol=0)
    torch.testing.assert_close(scaled[:2].std(1), torch.ones(2), atol=1e-4, rtol=0)  # sample std
    assert torch.equal(scaled[2], torch.zeros(4))  # equal rewards: zeros, not NaN
    with pytest.raises(ValueError, match="N >= 2"):
        policy_gradient.group_advantages(torch.ones(3, 1))


def test_reinforce_loss_by_hand_and_its_gradients():
    """B = 2: mean(-A logp + beta kl) = (-(1)(-1) + 0.5 * 0.2 + -(-1)(-2) + 0.5 * 0.4) / 2
    = (1 + 0.1 - 2 + 0.2) / 2 = -0.35; d/d logp = -A / B, d/d kl = beta / B, none into A."""
    logp = torch.tensor([-1.0, -2.0], requires_grad=True)
    adv = torch.tensor([1.0, -1.0], requires_grad=True)
    kl = torch.tensor([0.2, 0.4], requires_grad=True)
    loss = policy_gradient.reinforce_loss(logp, adv, kl, beta=0.5)
    assert loss.item() == pytest.approx(-0.35)
    loss.backward()
    torch.testing.assert_close(logp.grad, torch.tensor([-0.5, 0.5]))
    torch.testing.assert_close(kl.grad, torch.tensor([0.25, 0.25]))
    assert adv.grad is None
    with pytest.raises(ValueError, match="beta must be >= 0"):
        policy_gradient.reinforce_loss(logp, adv, kl, beta=-0.1)
    with pytest.raises(ValueError, match=r"must all be \(B,\)"):
        policy_gradient.reinforce_loss(logp, adv[:1], kl, beta=0.1)


def test_kl_and_config_bad_input():
    x = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="kind must be"):
        policy_gradient.kl_estimate(x, x, x.bool(), kind="k2")
    with pytest.raises(ValueError, match="must all be"):
        policy_gradient.kl_estimate(x, x, torch.zeros(2, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match="mask must be a bool"):
        policy_gradient.kl_estimate(x, x, x)
    with pytest.raises(ValueError, match="group_size must be an int >= 2"):
        policy_gradient.RLConfig(group_size=1)
    with pytest.raises(ValueError, match="beta must be >= 0, got -1"):
        policy_gradient.RLConfig(beta=-1.0)
    for field in ("steps", "prompts_per_step", "max_new_tokens"):
        with pytest.raises(ValueError, match=field):
            policy_gradient.RLConfig(**{field: 0})


# --------------------------------------------------------------------------- RL
def _rl(policy: GPT, beta: float, steps: int = 30, reward_fn=SEVEN, **kw) -> tuple[GPT, dict]:
    trained, ref = _trainable_copy(policy), sft.frozen_copy(policy)
    config = policy_gradient.RLConfig(steps=steps, prompts_per_step=4, group_size=8, max_new_tokens=3,
                                      beta=beta, lr=1e-2, seed=0)
    return trained, policy_gradient.train_rl(trained, ref, ["n="], reward_fn, config, progress=False, **kw)


def test_rl_raises_the_reward(digit_policy):
    """Reward 1 for "7\\n": the SFT policy says 7 one time in ten; 30 steps of 32 samples fix that."""
    before = _first_token_probs(digit_policy)[ord("7")].item()
    policy, history = _rl(digit_policy, beta=0.05)
    first, last = sum(history["reward"][:3]) / 3, sum(history["reward"][-5:]) / 5
    assert first < 0.35 and last > 0.8  # measured 0.10 -> 0.99
    assert _first_token_probs(policy)[ord("7")] > max(0.8, before + 0.5)
    assert history["kl"][0] == 0.0  # the policy starts as the reference
    assert all(math.isfinite(k) and k >= 0 for k in history["kl"]) and max(history["kl"]) > 0.1
    assert history["step"] == list(range(30)) and set(history) >= {"reward", "kl", "loss", "length"}


def test_a_large_beta_holds_the_policy_near_the_reference(digit_policy):
    """The leash: with beta = 0 the policy moves onto "7" (the exact KL of the first token heads
    for ln(1 / 0.08) = 2.5 nats as p(7) -> 1); with beta = 100 it stays near the reference."""
    ref = _first_token_probs(digit_policy)
    kl = {}
    for beta in (0.0, 100.0):
        policy, _ = _rl(digit_policy, beta=beta)
        p = _first_token_probs(policy)
        kl[beta] = (p * (p / ref).log()).sum().item()  # exact KL(policy || ref) of the first token
    assert kl[0.0] > 0.7 and kl[100.0] < 0.1 * kl[0.0]  # measured 1.38 and 0.024


def test_rl_against_a_reward_model_with_metrics(digit_policy):
    torch.manual_seed(0)
    rm = reward.RewardModel(_model(seed=3))
    policy, history = _rl(digit_policy, beta=0.1, steps=2, reward_fn=rm.score, metrics={"seven": SEVEN})
    assert len(history["reward"]) == len(history["seven"]) == 2
    assert all(0.0 <= s <= 1.0 for s in history["seven"])


def test_a_reward_that_depends_on_the_prompt_only_teaches_nothing(digit_policy):
    """Each group holds one prompt, so a reward fixed by the prompt has zero advantage: with
    beta = 0 the gradient is exactly 0 and AdamW leaves every parameter where it was. Groups
    that mixed prompts would see a difference and move."""
    policy, ref = _trainable_copy(digit_policy), sft.frozen_copy(digit_policy)
    optimizer = torch.optim.AdamW(policy.parameters(), lr=1e-2, weight_decay=0.0)
    config = policy_gradient.RLConfig(group_size=4, max_new_tokens=3, beta=0.0)
    stats = policy_gradient.rl_step(policy, ref, optimizer, ["n=", "m=", "n="],
                                    lambda ps, rs: [float(p == "n=") for p in ps], config)
    assert stats["reward"] == pytest.approx(2 / 3)
    for p, q in zip(policy.parameters(), ref.parameters(), strict=True):
        assert torch.equal(p, q)


def test_verifier_and_mean_reward(digit_policy):
    task = tasks.AdditionTask()
    assert policy_gradient.verifier(task.check)(["3+4=", "3+4="], ["7\n", "8\n"]).tolist() == [1.0, 0.0]
    greedy = policy_gradient.respond(digit_policy, ["n="], 3)[0]
    assert policy_gradient.mean_reward(digit_policy, ["n="] * 3, policy_gradient.verifier(
        lambda p, r: float(r == greedy)), 3) == 1.0


def test_plot_rl_draws_rewards_and_kl():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    history = {"step": [0, 1, 2], "reward": [0.1, 0.5, 0.9], "correct": [0.1, 0.2, 0.1],
               "kl": [0.0, 0.3, 0.6]}
    left, right = policy_gradient.plot_rl(history, keys=("reward", "correct"))
    assert len(left.get_lines()) == 2 and list(right.get_lines()[0].get_ydata()) == [0.0, 0.3, 0.6]
    plt.close("all")


def test_rl_bad_input(digit_policy):
    policy, ref = _trainable_copy(digit_policy), sft.frozen_copy(digit_policy)
    optimizer = torch.optim.AdamW(policy.parameters())
    config = policy_gradient.RLConfig(group_size=2, max_new_tokens=3)
    with pytest.raises(ValueError, match="at least one prompt"):
        policy_gradient.rl_step(policy, ref, optimizer, [], SEVEN, config)
    with pytest.raises(ValueError, match="at least one prompt"):
        policy_gradient.train_rl(policy, ref, [], SEVEN, config, progress=False)
    with pytest.raises(ValueError, match="one reward per response"):
        policy_gradient.rl_step(policy, ref, optimizer, ["n="], lambda p, r: torch.zeros(1), config)
    with pytest.raises(ValueError, match="exceeds the model's context_length=24"):
        policy_gradient.sample(policy, ["x" * 20], max_new_tokens=5)


# --------------------------------------------------------------------------- DPO
def test_dpo_loss_by_hand():
    """beta = 0.5.
    row 1: chosen log-ratio -1 - (-1.5) = 0.5, rejected -2 - (-1.5) = -0.5, z = 0.5 (0.5 + 0.5) = 0.5,
           loss = log(1 + e^-0.5) = log 1.6065307 = 0.4740770; rewards 0.25, -0.25.
    row 2: chosen -3 - (-2) = -1, rejected -1 - (-2) = 1, z = 0.5 (-1 - 1) = -1,
           loss = log(1 + e^1) = log 3.7182818 = 1.3132617; rewards -0.5, 0.5.
    mean loss (0.4740770 + 1.3132617) / 2 = 0.8936693."""
    loss, chosen, rejected = dpo.dpo_loss(torch.tensor([-1.0, -3.0]), torch.tensor([-2.0, -1.0]),
                                          torch.tensor([-1.5, -2.0]), torch.tensor([-1.5, -2.0]), beta=0.5)
    assert loss.item() == pytest.approx(0.8936693, abs=1e-6)
    torch.testing.assert_close(chosen, torch.tensor([0.25, -0.5]))
    torch.testing.assert_close(rejected, torch.tensor([-0.25, 0.5]))


def test_dpo_loss_is_the_closed_form_and_bradley_terry_on_implicit_rewards():
    g = torch.Generator().manual_seed(0)
    pc, pr, rc, rr = (-5 * torch.rand(8, generator=g) for _ in range(4))
    for beta in (0.1, 1.0, 3.0):
        loss, chosen, rejected = dpo.dpo_loss(pc, pr, rc, rr, beta)
        z = beta * ((pc - rc) - (pr - rr))
        torch.testing.assert_close(loss, F.softplus(-z).mean())  # -log sigmoid(z) = log(1 + e^-z)
        torch.testing.assert_close(loss, reward.bradley_terry_loss(beta * (pc - rc), beta * (pr - rr)))
        torch.testing.assert_close(chosen, beta * (pc - rc))  # rewards scale with beta
        torch.testing.assert_close(rejected, beta * (pr - rr))
        same = dpo.dpo_loss(pc, pc, rc, rc, beta)[0]  # zero margin: log 2 for every beta
        assert same.item() == pytest.approx(math.log(2))


def test_dpo_gradient_signs_and_detached_rewards():
    pc, pr = torch.tensor([-2.0], requires_grad=True), torch.tensor([-2.0], requires_grad=True)
    loss, chosen, rejected = dpo.dpo_loss(pc, pr, torch.tensor([-2.0]), torch.tensor([-2.0]), beta=0.1)
    loss.backward()
    assert pc.grad.item() < 0 < pr.grad.item()  # descent raises chosen, lowers rejected
    assert pc.grad.item() == pytest.approx(-0.05)  # -beta * sigmoid(-0) = -0.1 * 0.5
    assert not chosen.requires_grad and not rejected.requires_grad
    with pytest.raises(ValueError, match="beta must be > 0"):
        dpo.dpo_loss(pc, pr, pc, pr, beta=0.0)
    with pytest.raises(ValueError, match=r"must all be \(B,\)"):
        dpo.dpo_loss(pc, pr, pc, torch.zeros(2), beta=0.1)


def test_dpo_on_one_pair_moves_probability_from_rejected_to_chosen():
    """A policy over three whole responses (chosen, rejected, other), starting at the reference."""
    ref_logp = torch.log(torch.tensor([0.3, 0.5, 0.2]))
    theta = ref_logp.clone().requires_grad_(True)
    optimizer = torch.optim.SGD([theta], lr=1.0)
    for _ in range(50):
        logp = F.log_softmax(theta, -1)
        loss, _, _ = dpo.dpo_loss(logp[:1], logp[1:2], ref_logp[:1], ref_logp[1:2], beta=0.5)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    p = F.softmax(theta, -1).detach()
    assert p[0] > 0.3 + 0.2 and p[1] < 0.5 - 0.3  # chosen up, rejected down


def test_dpo_optimum_matches_the_log_odds_of_the_preferences():
    """If a fraction f of the comparisons prefer a to b, DPO's optimum has the Bradley-Terry
    reward gap of the data: beta (log pi(a)/ref(a) - log pi(b)/ref(b)) = log(f / (1 - f))."""
    f, beta = 0.8, 0.5
    ref_logp = torch.log(torch.tensor([0.3, 0.7]))
    theta = torch.zeros(2, requires_grad=True)
    optimizer = torch.optim.LBFGS([theta], max_iter=200, tolerance_grad=1e-10, line_search_fn="strong_wolfe")

    def closure():
        optimizer.zero_grad()
        logp = F.log_softmax(theta, -1)
        a_wins = dpo.dpo_loss(logp[:1], logp[1:], ref_logp[:1], ref_logp[1:], beta)[0]
        b_wins = dpo.dpo_loss(logp[1:], logp[:1], ref_logp[1:], ref_logp[:1], beta)[0]
        loss = f * a_wins + (1 - f) * b_wins
        loss.backward()
        return loss

    optimizer.step(closure)
    logp = F.log_softmax(theta.detach(), -1)
    gap = beta * ((logp[0] - ref_logp[0]) - (logp[1] - ref_logp[1]))
    assert gap.item() == pytest.approx(math.log(f / (1 - f)), abs=1e-4)


def test_train_dpo_separates_the_pairs():
    pairs = tasks.PreferenceTask().pairs(64, seed=0)
    policy = _model()
    ref = sft.frozen_copy(policy)
    with torch.no_grad():
        chosen, rejected = dpo.pair_logprobs(policy, pairs)
        idx, mask = sft.pack([pairs[0].prompt], [pairs[0].chosen])
        torch.testing.assert_close(chosen[0], sft.sequence_logprobs(policy(idx)[0], idx, mask)[0])
    before = (chosen - rejected).mean()
    config = TrainConfig(max_steps=20, batch_size=16, lr=3e-3, warmup_steps=2, min_lr=3e-4)
    history = dpo.train_dpo(policy, ref, pairs, config, beta=0.1, progress=False)
    with torch.no_grad():
        chosen, rejected = dpo.pair_logprobs(policy, pairs)
    assert (chosen - rejected).mean() > before + 1.0
    assert history["margin"][0] == 0.0 and history["margin"][-1] > 0.1 and history["accuracy"][-1] > 0.7
    with pytest.raises(ValueError, match="beta must be > 0"):
        dpo.train_dpo(policy, ref, pairs, TrainConfig(), beta=-1.0, progress=False)


def test_package_reexports():
    for name in rlhf.__all__:
        assert getattr(rlhf, name) is not None
    assert rlhf.dpo_loss is dpo.dpo_loss and rlhf.train_rl is policy_gradient.train_rl
