"""course_lib.flops against sum(p.numel()), published sizes, FlopCounterMode and measured tensors."""

import dataclasses

import pytest
import torch

from course_lib import attention, flops, model

BASE = model.ModelConfig(vocab_size=37, context_length=11, d_model=24, n_layers=3, n_heads=4)
VARIANTS = [
    {}, {"tie_embeddings": False}, {"bias": False}, {"norm": "rmsnorm"}, {"mlp": "swiglu"},
    {"n_kv_heads": 2}, {"n_kv_heads": 1}, {"positional": "rope"}, {"positional": "sinusoidal"},
    {"positional": "none"}, {"norm_position": "post"}, {"d_ff": 50}, {"n_layers": 1},
    {"mlp": "swiglu", "bias": False, "norm": "rmsnorm", "n_kv_heads": 2, "tie_embeddings": False},
]


@pytest.mark.parametrize("changes", VARIANTS, ids=str)
def test_param_count_is_exact_and_split_by_component(changes):
    config = dataclasses.replace(BASE, **changes)
    gpt = model.GPT(config)
    count = flops.param_count(config)
    assert count.total == sum(p.numel() for p in gpt.parameters()) == gpt.num_params()
    assert count.non_embedding == gpt.num_params(non_embedding=True)
    by_name = {
        "attention": sum(p.numel() for b in gpt.blocks for p in b.attn.parameters()),
        "mlp": sum(p.numel() for b in gpt.blocks for p in b.mlp.parameters()),
        "norms": sum(p.numel() for n, p in gpt.named_parameters() if "norm" in n),
        "embedding": gpt.tok_emb.weight.numel(),
    }
    for name, expected in by_name.items():
        assert getattr(count, name) == expected, name


PUBLISHED_TOTALS = {  # exact, tied GPT-2 with learned positions (HF's num_parameters())
    "gpt2": 124_439_808, "gpt2-medium": 354_823_168, "gpt2-large": 774_030_080, "gpt2-xl": 1_557_611_200,
    "llama3-8b": 8_030_261_248,
}


@pytest.mark.parametrize("name", PUBLISHED_TOTALS)
def test_published_models(name):
    config = flops.PUBLISHED[name]
    assert flops.param_count(config).total == PUBLISHED_TOTALS[name]
    if name in ("gpt2", "llama3-8b"):  # the model itself, on the meta device: shapes only
        with torch.device("meta"):
            gpt = model.GPT(config)
        assert sum(p.numel() for p in gpt.parameters()) == PUBLISHED_TOTALS[name]


def test_gpt3_175b_from_its_dimensions():
    c = flops.PUBLISHED["gpt3-175b"]
    twelve_l_d2 = flops.params_kaplan(c.d_model, c.n_layers)
    assert twelve_l_d2 == 12 * 96 * 12288**2 == 173_946_175_488
    assert twelve_l_d2 == pytest.approx(175e9, rel=0.01)
    assert flops.param_count(c).total == pytest.approx(174.6e9, rel=0.001)
    assert flops.params_deck3(c.d_model, c.n_layers, c.vocab_size) == twelve_l_d2 + 12288 * 50257
    # the GPT-3 family of Brown et al. (2020), Table 2.1, within 5% (they round)
    for name, size in [("gpt3-small", 125e6), ("gpt3-medium", 350e6), ("gpt3-large", 760e6),
                       ("gpt3-xl", 1.3e9), ("gpt3-2.7b", 2.7e9), ("gpt3-6.7b", 6.7e9), ("gpt3-13b", 13e9)]:
        assert flops.param_count(flops.PUBLISHED[name]).total == pytest.approx(size, rel=0.05), name


def test_lecture_approximations_differ_as_documented():
    d, L, V = 768, 12, 50257
    assert flops.params_deck2(d, L, V) - flops.params_deck3(d, L, V) == d * V  # the second matrix
    assert flops.params_kaplan(d, L) == 12 * L * d * d
    assert flops.params_kaplan(d, L, d_attn=2 * d, d_ff=3 * d) == 2 * d * L * (4 * d + 3 * d)
    exact = flops.param_count(flops.PUBLISHED["gpt2"])
    # Kaplan's N leaves out biases and norms too: within 0.2% of the exact non-embedding count
    assert flops.params_kaplan(d, L) == pytest.approx(exact.non_embedding, rel=2e-3)


def test_vgg16_has_the_first_decks_count():
    with torch.device("meta"):
        net = flops.vgg16()
    assert sum(p.numel() for p in net.parameters()) == 138_357_544
    small = flops.vgg16(num_classes=10)
    assert small(torch.randn(1, 3, 224, 224)).shape == (1, 10)


LLAMA_LIKE = {"mlp": "swiglu", "n_kv_heads": 2, "bias": False, "tie_embeddings": False}


@pytest.mark.parametrize("changes", [{}, LLAMA_LIKE, {"n_kv_heads": 1, "positional": "rope"}], ids=str)
@pytest.mark.parametrize("S", [1, 7, 11])
def test_forward_and_training_flops_match_flop_counter(changes, S):
    config = dataclasses.replace(BASE, **changes)
    gpt = model.GPT(config)
    B = 2
    idx = torch.randint(0, config.vocab_size, (B, S))
    per_token = flops.flops_per_token(config, S).total
    assert flops.count_flops(lambda: gpt(idx)) == B * S * per_token

    def step():
        _, loss = gpt(idx, idx)
        loss.backward()

    # backward: one matmul for the gradient w.r.t. the input, one w.r.t. the weight, for each forward one
    assert flops.count_flops(step) == flops.training_flops(config, B * S, S)


def test_checkpointing_costs_a_fourth_forward():
    assert flops.training_flops(BASE, 100, checkpointing=True) == 4 * 100 * flops.flops_per_token(BASE).total
    with pytest.raises(ValueError):
        flops.flops_per_token(BASE, 0)


def test_deck2_table_per_token():
    c = model.ModelConfig(vocab_size=1000, context_length=50, d_model=64, n_layers=1, n_heads=4)
    f = flops.flops_per_token(c)
    assert f.head == 2 * 64 * 1000
    assert f.mlp == 2 * 2 * 64 * (4 * 64)
    assert f.attention_proj == 2 * 4 * 64 * 64
    assert f.attention_mix == 2 * 2 * 50 * 64


def test_memory_counts():
    config = dataclasses.replace(BASE, n_kv_heads=2)
    n = flops.param_count(config).total
    mem = flops.training_memory(config)
    assert (mem.params, mem.grads, mem.optimizer, mem.total) == (4 * n, 4 * n, 8 * n, 16 * n)
    # AdamW's real state after one step has the size it says
    gpt = model.GPT(config)
    opt = torch.optim.AdamW(gpt.parameters())
    gpt(torch.zeros(1, 3, dtype=torch.long), torch.zeros(1, 3, dtype=torch.long))[1].backward()
    opt.step()
    state = sum(t.numel() * t.element_size() for s in opt.state.values() for k, t in s.items() if k != "step")
    assert state == mem.optimizer
    # the KV cache: what make_caches allocates
    caches = gpt.make_caches(3, capacity=9)
    allocated = sum(c.k.numel() * c.k.element_size() + c.v.numel() * c.v.element_size() for c in caches)
    assert allocated == flops.model_kv_cache_bytes(config, 3, 9)
    assert flops.model_kv_cache_bytes(config, 3, 9, bytes_per_value=2) == allocated // 2


def test_saved_activations_grow_with_batch_and_shrink_under_no_grad():
    gpt = model.GPT(BASE)
    one = flops.saved_activation_bytes(gpt, torch.zeros(1, 8, dtype=torch.long))
    four = flops.saved_activation_bytes(gpt, torch.zeros(4, 8, dtype=torch.long))
    assert 0 < one < four <= 4 * one + 1024
    with torch.no_grad():
        assert flops.saved_activation_bytes(gpt, torch.zeros(4, 8, dtype=torch.long)) == 0
    # a single Linear saves exactly its input
    lin = torch.nn.Linear(16, 8)
    assert flops.saved_activation_bytes(lin, torch.randn(5, 16)) == 5 * 16 * 4
    assert attention.causal_mask(3).dtype == torch.bool  # the masks are bool: tiny next to activations


@pytest.mark.parametrize("changes", [{}, LLAMA_LIKE | {"positional": "rope"}], ids=str)
def test_checkpointed_blocks_keep_block_inputs_and_recompute_in_backward(changes):
    config = dataclasses.replace(BASE, **changes)
    gpt = model.GPT(config)
    S = 9
    kw = dict(mask=attention.causal_mask(S), rotary=gpt.rotary, positions=torch.arange(S))

    class Stack(torch.nn.Module):
        def __init__(self, checkpointing):
            super().__init__()
            self.blocks, self.checkpointing = gpt.blocks, checkpointing

        def forward(self, x):
            if self.checkpointing:
                return flops.checkpointed_blocks(self.blocks, x, **kw)
            for block in self.blocks:
                x = block(x, **kw)
            return x

    x = torch.randn(2, S, config.d_model)
    results = []
    for checkpointing in (False, True):
        gpt.zero_grad()
        xi = x.clone().requires_grad_()
        out = Stack(checkpointing)(xi)
        out.square().sum().backward()
        results.append([out.detach(), xi.grad] + [p.grad.clone() for p in gpt.blocks.parameters()])
    for a, b in zip(*results, strict=True):
        torch.testing.assert_close(a, b)
    saved = flops.saved_activation_bytes(Stack(True), x.clone().requires_grad_())
    assert saved == config.n_layers * x.numel() * 4  # one (B, S, D) fp32 input per block
    assert saved < flops.saved_activation_bytes(Stack(False), x.clone().requires_grad_()) / 10
    xi = x.clone().requires_grad_()
    plain = flops.count_flops(lambda: Stack(False)(xi).sum().backward())
    assert plain < flops.count_flops(lambda: Stack(True)(xi).sum().backward()) <= plain * 4 / 3


def test_machine_rates_and_mfu():
    matmul = flops.matmul_flops_per_second(n=256, repeats=2)
    elementwise = flops.elementwise_flops_per_second(n=1 << 16, repeats=2)
    assert matmul > 0 and elementwise > 0
    assert flops.mfu(5.0, 10.0) == 0.5
    with pytest.raises(ValueError):
        flops.mfu(1.0, 0.0)
