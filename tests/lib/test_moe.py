"""Tests for course_lib.moe: routing and capacity, the fast dispatch against the token loop,
the router losses and a Mixtral block against HuggingFace's, the MoE GPT, and expert
parallelism over two processes against one."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import nn

from course_lib import flops, moe
from course_lib import model as M
from course_lib import train as T

D = 16


def _experts(config: M.ModelConfig, n: int) -> nn.ModuleList:
    return nn.ModuleList(M.MLP(config) for _ in range(n))


def _layer(seed: int = 0, **moe_kw) -> moe.MoE:
    torch.manual_seed(seed)
    return M.feed_forward(M.ModelConfig(d_model=D, d_ff=24, moe=moe.MoEConfig(**moe_kw)))


# ---------------------------------------------------------------- routing and capacity

@pytest.mark.parametrize(("T_", "E", "K", "factor", "want"),
                         [(64, 4, 1, 1.0, 16), (64, 4, 1, 1.25, 20), (64, 4, 2, 1.0, 32), (10, 3, 1, 1.0, 4),
                          (10, 4, 1, 0.01, 1), (7, 2, 1, None, 7)])
def test_expert_capacity(T_, E, K, factor, want):
    assert moe.expert_capacity(T_, E, K, factor) == want


def test_route_seats_choice_major_as_the_docstring_draws():
    # first choices t0->e1 t1->e0 t2->e1 t3->e1, second t0->e0 t1->e2 t2->e2 t3->e0; C = 2
    logits = torch.tensor([[2.0, 3.0, 0.0], [3.0, 0.0, 2.0], [0.0, 3.0, 2.0], [2.0, 3.0, 0.0]])
    r = moe.route(logits, top_k=2, capacity=2)
    assert r.experts.tolist() == [[1, 0], [0, 2], [1, 2], [1, 0]]
    assert r.kept.tolist() == [[True, True], [True, True], [True, True], [False, False]]
    assert r.load.tolist() == [3, 3, 2] and r.kept_load.tolist() == [2, 2, 2] and r.dropped == 2


def test_route_gates_are_probabilities_or_renormalised():
    logits = torch.randn(50, 6, generator=torch.Generator().manual_seed(0))
    probs = torch.softmax(logits, -1)
    r = moe.route(logits, 2, capacity=50)
    top = probs.topk(2, -1)
    torch.testing.assert_close(r.gates, top.values)
    assert torch.equal(r.experts, top.indices) and r.kept.all()
    r = moe.route(logits, 2, capacity=50, renormalize=True)
    torch.testing.assert_close(r.gates, top.values / top.values.sum(-1, keepdim=True))


@pytest.mark.parametrize("K", [1, 2, 3])
def test_capacity_is_never_exceeded_and_earlier_tokens_win(K):
    logits = torch.randn(200, 5, generator=torch.Generator().manual_seed(K)) * 3
    r = moe.route(logits, K, capacity=30)
    assert r.kept_load.max() <= 30 and r.kept_load.sum() + r.dropped == 200 * K
    for e in range(5):  # within the first choice, expert e keeps exactly its earliest tokens
        first = (r.experts[:, 0] == e).nonzero().flatten()
        assert r.kept[first, 0].tolist() == [i < 30 for i in range(len(first))]


# ---------------------------------------------------------------- dispatch = the loop over tokens

@pytest.mark.parametrize(("K", "factor", "renormalize", "mlp"),
                         [(1, 1.0, False, "gelu"), (1, 0.5, False, "swiglu"), (2, 1.25, True, "swiglu"),
                          (2, None, False, "gelu"), (3, 0.7, True, "gelu")])
def test_dispatch_equals_the_reference_loop_and_its_gradients(K, factor, renormalize, mlp):
    torch.manual_seed(K)
    cfg = M.ModelConfig(d_model=D, d_ff=20, mlp=mlp)
    experts, router = _experts(cfg, 4), nn.Linear(D, 4, bias=False)
    x = torch.randn(37, D, requires_grad=True)
    cap = moe.expert_capacity(37, 4, K, factor)

    logits = router(x)
    fast = moe.dispatch(x, experts, moe.route(logits, K, cap, renormalize))
    grads_fast = torch.autograd.grad((fast ** 2).sum(), [x, router.weight, *experts.parameters()])
    slow = moe.moe_reference(x, router(x), experts, K, cap, renormalize)
    grads_slow = torch.autograd.grad((slow ** 2).sum(), [x, router.weight, *experts.parameters()])

    torch.testing.assert_close(fast, slow)
    for a, b in zip(grads_fast, grads_slow, strict=True):
        torch.testing.assert_close(a, b)
    assert grads_fast[1].abs().sum() > 0  # the router learns through the gates, top-1 included


def test_a_token_whose_choices_are_all_dropped_gets_zero():
    layer = _layer(n_experts=2, capacity_factor=0.1)  # capacity 1 of 20 tokens per expert
    x = torch.randn(20, D)
    y = layer(x)
    dropped = ~layer.routing.kept.any(-1)
    assert dropped.sum() == 18 and torch.equal(y[dropped], torch.zeros_like(y[dropped]))
    assert (y[~dropped].abs().sum(-1) > 0).all()


# ---------------------------------------------------------------- losses and HuggingFace

def test_load_balancing_loss_by_hand_and_against_huggingface():
    from transformers.models.mixtral.modeling_mixtral import load_balancing_loss_func as mixtral_lb
    from transformers.models.switch_transformers.modeling_switch_transformers import (
        load_balancing_loss_func as switch_lb,
    )
    from transformers.models.switch_transformers.modeling_switch_transformers import router_z_loss_func

    # by hand: all tokens to expert 0 with probability 0.7 of 2 experts: 2 * (1 * 0.7 + 0 * 0.3)
    probs = torch.tensor([[0.7, 0.3]] * 4)
    assert moe.load_balancing_loss(probs, torch.zeros(4, 1, dtype=torch.long)).item() == pytest.approx(1.4)
    for seed, (T_, E, K) in enumerate([(32, 4, 1), (50, 8, 2), (9, 3, 3)]):
        logits = torch.randn(T_, E, generator=torch.Generator().manual_seed(seed)) * 2
        r = moe.route(logits, K, T_)
        ours = moe.load_balancing_loss(r.probs, r.experts)
        torch.testing.assert_close(ours, mixtral_lb((logits,), E, K))
        if K == 1:
            torch.testing.assert_close(ours, switch_lb(r.probs[None], r.experts[None]))
        torch.testing.assert_close(moe.router_z_loss(logits), router_z_loss_func(logits[None]))


def test_layer_equals_huggingface_mixtral_sparse_block():
    from transformers import MixtralConfig
    from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock, load_balancing_loss_func

    E, K, F_ = 4, 2, 24
    hc = MixtralConfig(hidden_size=D, intermediate_size=F_, num_local_experts=E, num_experts_per_tok=K,
                       router_jitter_noise=0.0)
    theirs = MixtralSparseMoeBlock(hc).eval()
    ours = M.feed_forward(M.ModelConfig(d_model=D, d_ff=F_, mlp="swiglu", bias=False,
                                        moe=moe.MoEConfig(n_experts=E, top_k=K, capacity_factor=None,
                                                          renormalize=True)))
    with torch.no_grad():
        for p in ours.parameters():
            p.normal_(0, 0.3)
        theirs.gate.weight.copy_(ours.router.weight)
        for e, expert in enumerate(ours.experts):
            theirs.experts.gate_up_proj[e].copy_(torch.cat([expert.gate_proj.weight, expert.up_proj.weight]))
            theirs.experts.down_proj[e].copy_(expert.down_proj.weight)
    x = torch.randn(3, 7, D, requires_grad=True)
    y = ours(x)
    y_hf = theirs(x)
    torch.testing.assert_close(y, y_hf)
    torch.testing.assert_close(torch.autograd.grad(y.sum(), x)[0], torch.autograd.grad(y_hf.sum(), x)[0])
    logits_hf, _, _ = theirs.gate(x.reshape(-1, D))
    torch.testing.assert_close(ours.balance_loss, load_balancing_loss_func((logits_hf,), E, K))


# ---------------------------------------------------------------- the layer and the MoE GPT

def test_router_runs_in_fp32_under_bf16_autocast():
    layer = _layer(n_experts=4)
    x = torch.randn(2, 5, D)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = layer(x)
        assert layer.router_logits(x.view(-1, D)).dtype == torch.float32
    assert layer.routing.probs.dtype == torch.float32 and y.dtype == torch.bfloat16
    torch.testing.assert_close(y.float(), layer(x), atol=0.05, rtol=0.05)


def test_aux_loss_weights_both_router_losses():
    layer = _layer(n_experts=4, balance_coef=0.5, z_loss_coef=0.25)
    layer(torch.randn(10, D))
    torch.testing.assert_close(layer.aux_loss, 0.5 * layer.balance_loss + 0.25 * layer.z_loss)
    both = nn.Sequential(layer, _layer(1, n_experts=2))
    both(torch.randn(10, D))
    torch.testing.assert_close(moe.aux_loss(both), both[0].aux_loss + both[1].aux_loss)
    assert moe.aux_loss(nn.Linear(2, 2)) == 0.0


CFG = M.ModelConfig(vocab_size=32, context_length=16, d_model=D, n_layers=2, n_heads=2,
                    moe=moe.MoEConfig(n_experts=4, top_k=2, capacity_factor=None))


def test_moe_gpt_counts_its_parameters_and_flops():
    torch.manual_seed(0)
    gpt = M.GPT(CFG)
    count = flops.param_count(CFG)
    assert gpt.num_params() == count.total
    dense = flops.param_count(dataclasses.replace(CFG, moe=None))
    router = 2 * D * 4  # L x D x E
    assert count.mlp == 4 * dense.mlp + router
    assert flops.active_params(CFG) == dense.total + router + dense.mlp  # K = 2 of 4 experts
    idx = torch.randint(0, 32, (3, 16))
    assert flops.count_flops(lambda: gpt(idx)) == 3 * 16 * flops.flops_per_token(CFG).total


def test_moe_gpt_adds_aux_loss_in_training_only_and_learns():
    torch.manual_seed(0)
    gpt = M.GPT(CFG)
    idx = torch.randint(0, 32, (4, 16))
    train_loss = gpt(idx, idx)[1]
    torch.testing.assert_close(train_loss, gpt.eval()(idx, idx)[1] + moe.aux_loss(gpt))
    ids = torch.arange(2000) % 7  # a periodic sequence: easy to learn
    config = T.TrainConfig(max_steps=60, warmup_steps=5, lr=3e-3, batch_size=8, eval_every=60,
                           eval_batches=2, device="cpu", precision="fp32")
    history = T.train(M.GPT(CFG), ids, ids, config, progress=False)
    assert history.val_loss[-1] < 0.5 * history.val_loss[0]


def test_moe_config_survives_a_checkpoint(tmp_path):
    gpt = M.GPT(CFG)
    opt = torch.optim.AdamW(gpt.parameters())
    T.save_checkpoint(tmp_path / "c.pt", gpt, opt, 0, T.History(), torch.Generator())
    ckpt = T.load_checkpoint(tmp_path / "c.pt")
    again = M.GPT(M.ModelConfig(**ckpt["model_config"]))
    again.load_state_dict(ckpt["model"])
    assert again.config == CFG and isinstance(again.blocks[0].mlp, moe.MoE)


@pytest.mark.parametrize(("kwargs", "match"), [
    (dict(n_experts=4, top_k=5), "top_k=5 is larger than n_experts=4"),
    (dict(capacity_factor=0.0), "capacity_factor must be > 0"),
    (dict(capacity_factor=-1.0), "capacity_factor must be > 0"),
    (dict(n_experts=0), "n_experts must be an int >= 1"),
    (dict(top_k=1, renormalize=True), "renormalize=True with top_k=1"),
    (dict(balance_coef=-0.1), "balance_coef must be >= 0"),
])
def test_bad_moe_configs_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        moe.MoEConfig(**kwargs)


def test_bad_inputs_are_refused():
    layer = _layer(n_experts=4)
    with pytest.raises(ValueError, match=r"MoE expects inputs \(..., D=16\), got shape \(2, 5, 8\)"):
        layer(torch.randn(2, 5, 8))
    with pytest.raises(ValueError, match="top_k must be in 1 .. E=4"):
        moe.route(torch.randn(5, 4), top_k=5, capacity=5)
    with pytest.raises(ValueError, match=r"logits must be \(T, E\)"):
        moe.route(torch.randn(2, 5, 4), top_k=1, capacity=5)
    with pytest.raises(TypeError, match="moe must be a MoEConfig"):
        M.ModelConfig(moe=4)
    with pytest.raises(TypeError, match="config must be a MoEConfig"):
        moe.MoE(D, {"n_experts": 2}, nn.Identity)


# ---------------------------------------------------------------- expert parallelism

@pytest.mark.parametrize("factor", [None, 0.8])
def test_expert_parallel_over_two_processes_equals_one(factor):
    layer = _layer(n_experts=4, top_k=2, capacity_factor=factor)
    gen = torch.Generator().manual_seed(1)
    shards = [torch.randn(2, 9, D, generator=gen), torch.randn(13, D, generator=gen)]
    upstream = [torch.randn(s.shape, generator=gen) for s in shards]
    result = moe.run_expert_parallel(layer, shards, upstream)

    loss = sum((layer(s) * u).sum() + layer.aux_loss for s, u in zip(shards, upstream, strict=True))
    loss.backward()
    for r, shard in enumerate(shards):
        torch.testing.assert_close(result.outputs[r], layer(shard))
        assert sum(result.sent[r]) == int(layer.routing.kept.sum())  # each kept choice travels once
    assert result.grads.keys() == dict(layer.named_parameters()).keys()
    for name, p in layer.named_parameters():
        torch.testing.assert_close(result.grads[name], p.grad, msg=name)


def test_expert_parallel_needs_experts_divisible_by_ranks():
    with pytest.raises(ValueError, match="n_experts=3 must be divisible by W=2"):
        moe.run_expert_parallel(_layer(n_experts=3), [torch.randn(4, D), torch.randn(4, D)])

