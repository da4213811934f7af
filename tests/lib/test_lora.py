"""Tests for course_lib.lora.

Oracle: peft (a test-only dependency) wraps a deep copy of the same GPT by the same Linear names;
with our A, B copied into its ``lora_A`` (= A^T) and ``lora_B`` (= B^T), the logits, the
gradients of A and B and the merged weights must agree. Hand-worked: ``x @ (W + s (A B)^T)^T + b``
for one layer, parameter and AdamW byte counts ``R (D_in + D_out)`` per layer. Properties: B = 0
== base (exactly), merged == unmerged, training moves only A and B, adapters saved alone reload
to identical logits, bad input errors.
"""

from __future__ import annotations

import copy
import dataclasses
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from course_lib import flops, lora, pretrained
from course_lib.model import GPT, EncoderDecoder, ModelConfig

GELU = ModelConfig(vocab_size=23, context_length=16, d_model=32, n_layers=2, n_heads=4)
SWIGLU = dataclasses.replace(GELU, mlp="swiglu", bias=False, norm="rmsnorm", positional="rope",
                             tie_embeddings=False, n_kv_heads=2)
ADAPTED_BY_DEFAULT = ["blocks.0.attn.q_proj", "blocks.0.attn.v_proj", "blocks.1.attn.q_proj",
                      "blocks.1.attn.v_proj"]


def _model(config: ModelConfig = GELU, seed: int = 0) -> GPT:
    torch.manual_seed(seed)
    return GPT(config).eval()


def _ids(B: int = 3, S: int = 12, V: int = GELU.vocab_size, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, V, (B, S), generator=torch.Generator().manual_seed(seed))


def _randomise_b(model: nn.Module, seed: int = 2) -> None:
    """B = 0 hides every mistake in the low-rank path, so give B values."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, lora.LoRALinear):
                m.B.copy_(0.1 * torch.randn(m.B.shape, generator=g))


def _widths(config: ModelConfig) -> dict[str, tuple[int, int]]:
    """(D_in, D_out) of each projection, by hand."""
    D, F_, kv = config.d_model, config.ff_width, config.kv_heads * config.head_dim
    return {"q_proj": (D, D), "k_proj": (D, kv), "v_proj": (D, kv), "o_proj": (D, D),
            "up_proj": (D, F_), "gate_proj": (D, F_), "down_proj": (F_, D)}


# --- LoRALinear ---------------------------------------------------------------------------------

def test_lora_linear_starts_as_its_base_with_peft_init():
    torch.manual_seed(0)
    base = nn.Linear(256, 96)
    layer = lora.LoRALinear(base, rank=64, alpha=16.0)
    assert layer.A.shape == (256, 64) and layer.B.shape == (64, 96) and layer.scaling == 0.25
    assert torch.count_nonzero(layer.B) == 0
    x = torch.randn(4, 256)
    assert torch.equal(layer(x), base(x))
    # peft's kaiming_uniform_(a=sqrt(5)) on an (R, D_in) weight is U(-1/sqrt(D_in), 1/sqrt(D_in)):
    # the bound depends on D_in, not on R (a fan-in taken from the (D_in, R) layout would give 1/8)
    bound = 1 / math.sqrt(256)
    assert layer.A.abs().max() <= bound and layer.A.abs().max() > 0.95 * bound
    assert layer.A.std().item() == pytest.approx(bound / math.sqrt(3), rel=0.05)
    assert not base.weight.requires_grad and not base.bias.requires_grad
    assert layer.A.requires_grad and layer.B.requires_grad


@pytest.mark.parametrize("rank, alpha, bias", [(1, 3.0, True), (3, 6.0, False), (5, 2.0, True)])
def test_lora_linear_is_the_hand_formula(rank, alpha, bias):
    """y = x W^T + b + s x A B = x (W + s (A B)^T)^T + b, with W nn.Linear's (D_out, D_in) weight."""
    torch.manual_seed(0)
    base = nn.Linear(12, 7, bias=bias)
    layer = lora.LoRALinear(base, rank=rank, alpha=alpha)
    _randomise_b(layer)
    x = torch.randn(5, 12)
    s = alpha / rank
    W = base.weight
    expected = x @ (W + s * (layer.A @ layer.B).T).T + (base.bias if bias else 0)
    torch.testing.assert_close(layer(x), expected)
    torch.testing.assert_close(layer.delta_weight(), s * (layer.A @ layer.B).T)
    assert layer.delta_weight().shape == (7, 12)


def test_merge_and_unmerge_round_trip():
    torch.manual_seed(0)
    base = nn.Linear(12, 7)
    layer = lora.LoRALinear(base, rank=3, alpha=6.0)
    _randomise_b(layer)
    w0, x = base.weight.detach().clone(), torch.randn(5, 12)
    y = layer(x)
    layer.merge()
    assert layer.merged
    torch.testing.assert_close(base.weight, w0 + 2.0 * (layer.A @ layer.B).T)
    torch.testing.assert_close(layer(x), y)  # the low-rank path is skipped, not added twice
    with pytest.raises(RuntimeError, match="already merged"):
        layer.merge()
    layer.unmerge()
    assert not layer.merged
    torch.testing.assert_close(base.weight, w0)
    torch.testing.assert_close(layer(x), y)
    with pytest.raises(RuntimeError, match="not merged"):
        layer.unmerge()


def test_any_leading_dims():
    torch.manual_seed(0)
    layer = lora.LoRALinear(nn.Linear(12, 7), rank=2)
    _randomise_b(layer)
    x = torch.randn(2, 5, 12)  # (B, S, D_in)
    y = layer(x)
    assert y.shape == (2, 5, 7)
    torch.testing.assert_close(layer(x[1, 3]), y[1, 3])  # (D_in,) -> (D_out,)
    assert layer(x[1, 3]).shape == (7,)


def test_dropout_is_on_the_low_rank_input_only_and_only_in_train_mode():
    torch.manual_seed(0)
    layer = lora.LoRALinear(nn.Linear(12, 7), rank=3, alpha=3.0, dropout=0.5)
    _randomise_b(layer)
    x = torch.randn(6, 12)
    layer.eval()
    torch.testing.assert_close(layer(x), layer.base(x) + x @ layer.A @ layer.B)
    layer.train()
    torch.manual_seed(5)
    y = layer(x)
    torch.manual_seed(5)
    dropped = F.dropout(x, 0.5, training=True)  # the same mask: base(x) sees every input
    torch.testing.assert_close(y, layer.base(x) + dropped @ layer.A @ layer.B)
    assert not torch.allclose(y, layer.base(x) + x @ layer.A @ layer.B)
    assert isinstance(lora.LoRALinear(nn.Linear(4, 4), rank=1).dropout, nn.Identity)


def test_follows_bf16_autocast_and_a_bf16_base():
    torch.manual_seed(0)
    layer = lora.LoRALinear(nn.Linear(16, 8), rank=4)
    _randomise_b(layer)
    x = torch.randn(3, 16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = layer(x)
    assert y.dtype == torch.bfloat16
    torch.testing.assert_close(y.float(), layer(x), atol=0.05, rtol=0.05)
    layer.base.to(torch.bfloat16)  # adapters stay fp32, as QLoRA keeps them
    assert layer(x.bfloat16()).dtype == torch.bfloat16


# --- apply_lora on whole models -----------------------------------------------------------------

@pytest.mark.parametrize("config", [GELU, SWIGLU], ids=["gelu", "swiglu-gqa-nobias"])
@pytest.mark.parametrize("targets, projections", [
    (("q_proj", "v_proj"), ("q_proj", "v_proj")),
    (("attn",), ("q_proj", "k_proj", "v_proj", "o_proj")),
    (("mlp",), ("up_proj", "down_proj", "gate_proj")),
    (("o_proj", "down_proj"), ("o_proj", "down_proj")),
])
def test_apply_lora_adapts_the_named_layers_and_trains_only_a_and_b(config, targets, projections):
    model = _model(config)
    reference, ids = copy.deepcopy(model), _ids()
    R = 4
    names = lora.apply_lora(model, lora.LoRAConfig(rank=R, targets=targets))
    if config.mlp == "gelu":
        projections = tuple(p for p in projections if p != "gate_proj")  # "mlp" takes what exists
    part = {p: "attn" if p in lora.SHORTHANDS["attn"] else "mlp" for p in projections}
    assert names == sorted(f"blocks.{i}.{part[p]}.{p}" for i in range(config.n_layers) for p in projections)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable == {f"{n}.{m}" for n in names for m in ("A", "B")}
    widths = _widths(config)
    count = config.n_layers * sum(R * (widths[p][0] + widths[p][1]) for p in projections)
    assert lora.trainable_parameters(model) == (count, flops.param_count(config).total + count)
    assert torch.equal(model(ids)[0], reference(ids)[0])  # B = 0: exactly the model it wraps


def test_training_moves_only_the_adapters_and_lowers_the_loss():
    model = _model(SWIGLU)
    lora.apply_lora(model, lora.LoRAConfig(rank=4, targets=("attn", "mlp")))
    frozen = {n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad}
    adapters = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    ids = _ids(4, 16)
    model.train()
    losses = []
    for _ in range(15):
        _, loss = model(ids[:, :-1], ids[:, 1:])
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0] - 0.1
    for n, p in model.named_parameters():
        if n in frozen:
            assert torch.equal(p, frozen[n]) and p.grad is None, n
        else:
            assert not torch.equal(p, adapters[n]), n


@pytest.mark.parametrize("config", [GELU, SWIGLU], ids=["gelu-tied", "swiglu-untied"])
def test_merge_and_unwrap_give_the_adapted_logits(config):
    model, ids = _model(config), _ids()
    plain_keys = set(model.state_dict())
    names = lora.apply_lora(model, lora.LoRAConfig(rank=4, alpha=8.0, targets=("attn", "mlp")))
    _randomise_b(model)
    adapted = model(ids)[0]
    assert not torch.allclose(adapted, _model(config)(ids)[0])  # B != 0 changes the model
    assert lora.merge_lora(model) == names
    torch.testing.assert_close(model(ids)[0], adapted)
    assert lora.unmerge_lora(model) == names
    torch.testing.assert_close(model(ids)[0], adapted)
    assert lora.unwrap_lora(model) is model
    assert not any(isinstance(m, lora.LoRALinear) for m in model.modules())
    assert all(type(model.get_submodule(n)) is nn.Linear for n in names)
    assert set(model.state_dict()) == plain_keys
    torch.testing.assert_close(model(ids)[0], adapted)


def test_the_shipped_checkpoint_is_unchanged_at_init():
    model = pretrained.load()
    ids = _ids(2, 32, 256)
    before = model(ids)[0]
    names = lora.apply_lora(model, lora.LoRAConfig())
    assert len(names) == 2 * model.config.n_layers
    assert torch.equal(model(ids)[0], before)


def test_targets_match_whole_names_on_any_module():
    class Toy(nn.Module):
        def __init__(self):
            super().__init__()
            self.q_proj = nn.Linear(8, 8)  # top level: the qualified name is the target itself
            self.qq_proj = nn.Linear(8, 8)  # ends in "q_proj" but is not named q_proj
            self.block = nn.ModuleDict({"v_proj": nn.Linear(8, 4), "other": nn.Linear(4, 4)})

    toy = Toy()
    assert lora.apply_lora(toy, lora.LoRAConfig(rank=2, targets=("q_proj", "v_proj"))) == ["block.v_proj",
                                                                                           "q_proj"]
    assert type(toy.qq_proj) is nn.Linear and not toy.qq_proj.weight.requires_grad
    assert isinstance(toy.block["v_proj"], lora.LoRALinear)


def test_works_on_an_encoder_decoder_without_a_second_model_class():
    torch.manual_seed(0)
    model = EncoderDecoder(GELU).eval()
    names = lora.apply_lora(model, lora.LoRAConfig(rank=2, targets=("attn",)))
    L = GELU.n_layers  # encoder: self-attention; decoder: self- and cross-attention
    assert len(names) == 4 * L + 8 * L and any(".cross_attn.q_proj" in n for n in names)
    assert model(_ids(), _ids(seed=3))[0].shape == (3, 12, GELU.vocab_size)


# --- parity with peft ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def peft():
    try:
        import peft
    except ImportError:  # part of the test extra: a clear failure, never a silent skip
        pytest.fail("peft is missing: it is a test dependency, install it with "
                    "pip install -c constraints.txt -e '.[test]'", pytrace=False)
    return peft


@pytest.mark.parametrize("config, rank, targets", [
    (GELU, 1, ("q_proj", "v_proj")),
    (GELU, 4, ("attn", "up_proj")),
    (SWIGLU, 4, ("o_proj", "mlp")),
], ids=["gelu-r1-qv", "gelu-r4-attn-up", "swiglu-r4-o-mlp"])
def test_parity_with_peft(peft, config, rank, targets):
    """peft wraps our GPT as it is (PeftModel takes any nn.Module; no workaround needed)."""
    ours = _model(config)
    theirs = copy.deepcopy(ours)
    cfg = lora.LoRAConfig(rank=rank, alpha=8.0, targets=targets)
    names = lora.apply_lora(ours, cfg)
    _randomise_b(ours)
    peft_config = peft.LoraConfig(r=rank, lora_alpha=8.0, target_modules=list(cfg.names), lora_dropout=0.0)
    theirs = peft.get_peft_model(theirs, peft_config)
    inner = theirs.base_model.model
    with torch.no_grad():
        for n in names:
            layer = inner.get_submodule(n)
            # peft's init is ours: U(-1/sqrt(D_in), 1/sqrt(D_in)) for A, zeros for B
            assert layer.lora_A.default.weight.abs().max() <= 1 / math.sqrt(layer.in_features)
            assert torch.count_nonzero(layer.lora_B.default.weight) == 0
            layer.lora_A.default.weight.copy_(ours.get_submodule(n).A.T)  # (D_in, R) -> (R, D_in)
            layer.lora_B.default.weight.copy_(ours.get_submodule(n).B.T)  # (R, D_out) -> (D_out, R)
    assert lora.trainable_parameters(ours)[0] == theirs.get_nb_trainable_parameters()[0]

    ids = _ids()
    logits, loss = ours(ids[:, :-1], ids[:, 1:])
    their_logits, their_loss = theirs(ids[:, :-1], ids[:, 1:])
    torch.testing.assert_close(logits, their_logits)
    loss.backward()
    their_loss.backward()
    for n in names:
        mine, layer = ours.get_submodule(n), inner.get_submodule(n)
        torch.testing.assert_close(mine.A.grad, layer.lora_A.default.weight.grad.T)
        torch.testing.assert_close(mine.B.grad, layer.lora_B.default.weight.grad.T)

    merged, their_merged = lora.unwrap_lora(ours).state_dict(), theirs.merge_and_unload().state_dict()
    assert merged.keys() == their_merged.keys()
    for key in merged:
        torch.testing.assert_close(merged[key], their_merged[key], msg=key)


# --- saving adapters alone ----------------------------------------------------------------------

def test_adapters_save_alone_and_reload_to_identical_logits(tmp_path):
    config, ids = lora.LoRAConfig(rank=8), _ids(2, 32, 256)
    model = pretrained.load()
    lora.apply_lora(model, config)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    for _ in range(3):
        _, loss = model(ids[:, :-1], ids[:, 1:])
        opt.zero_grad()
        loss.backward()
        opt.step()
    state = lora.lora_state_dict(model)
    assert set(state) == {n for n, p in model.named_parameters() if p.requires_grad}
    torch.save(state, tmp_path / "adapter.pt")
    torch.save(model.state_dict(), tmp_path / "full.pt")
    assert (tmp_path / "adapter.pt").stat().st_size < (tmp_path / "full.pt").stat().st_size / 20

    fresh = pretrained.load()
    lora.apply_lora(fresh, config)
    assert not torch.equal(fresh(ids)[0], model(ids)[0])
    lora.load_lora_state_dict(fresh, torch.load(tmp_path / "adapter.pt", weights_only=True))
    assert torch.equal(fresh(ids)[0], model(ids)[0])

    saved = torch.load(tmp_path / "adapter.pt", weights_only=True)
    other_rank = pretrained.load()
    lora.apply_lora(other_rank, dataclasses.replace(config, rank=4))
    with pytest.raises(ValueError, match=r"blocks\.0\.attn\.q_proj\.A: shape \(128, 8\) in the state, "
                                         r"\(128, 4\) in the model"):
        lora.load_lora_state_dict(other_rank, saved)
    other_targets = pretrained.load()
    lora.apply_lora(other_targets, dataclasses.replace(config, targets=("attn",)))
    with pytest.raises(ValueError, match=r"missing \['blocks\.0\.attn\.k_proj\.A'"):
        lora.load_lora_state_dict(other_targets, saved)
    with pytest.raises(ValueError, match=r"unexpected \['extra\.A'\]"):
        lora.load_lora_state_dict(fresh, {**saved, "extra.A": torch.zeros(1)})
    with pytest.raises(ValueError, match="call apply_lora"):
        lora.load_lora_state_dict(pretrained.load(), saved)
    lora.merge_lora(fresh)
    with pytest.raises(RuntimeError, match="unmerge_lora"):
        lora.load_lora_state_dict(fresh, saved)


# --- accounting ---------------------------------------------------------------------------------

def test_parameter_and_adamw_accounting():
    model = _model(GELU)
    N = flops.param_count(GELU).total  # the tied head counted once
    assert lora.trainable_parameters(model) == (N, N)
    assert lora.adamw_state_bytes(model) == flops.training_memory(GELU).optimizer == 8 * N
    lora.apply_lora(model, lora.LoRAConfig(rank=4))
    lora_params = 2 * 2 * 4 * (32 + 32)  # L layers x (q, v) x R (D_in + D_out)
    assert lora.trainable_parameters(model) == (lora_params, N + lora_params)
    assert lora.adamw_state_bytes(model) == 8 * 1024
    # the point of it: the optimizer state shrinks by the ratio of the counts
    assert lora.adamw_state_bytes(model) / flops.training_memory(GELU).optimizer == lora_params / N


# --- bad input ----------------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs, match", [
    ({"rank": 0}, r"rank must be an int >= 1, got 0"),
    ({"rank": 2.5}, r"rank must be an int >= 1, got 2\.5"),
    ({"alpha": 0.0}, r"alpha must be > 0, got 0\.0"),
    ({"dropout": 1.0}, r"dropout must be in \[0, 1\), got 1\.0"),
    ({"targets": ()}, r"targets must name at least one layer"),
    ({"targets": ("q_proj", "qproj")}, r"unknown targets \['qproj'\]"),
    ({"targets": ("lm_head",)}, r"unknown targets \['lm_head'\]"),
])
def test_config_rejects_bad_values(kwargs, match):
    with pytest.raises(ValueError, match=match):
        lora.LoRAConfig(**kwargs)


def test_config_normalises_targets():
    assert lora.LoRAConfig(targets="attn").targets == ("attn",)
    assert lora.LoRAConfig(targets=["q_proj", "attn"]).names == ("q_proj", "k_proj", "v_proj", "o_proj")


def test_lora_linear_rejects_bad_input():
    with pytest.raises(ValueError, match=r"min\(d_in, d_out\) = 3 adds parameters without adding "):
        lora.LoRALinear(nn.Linear(8, 3), rank=4)
    with pytest.raises(ValueError, match="rank must be an int >= 1, got 0"):
        lora.LoRALinear(nn.Linear(8, 3), rank=0)
    with pytest.raises(TypeError, match="wraps an nn.Linear, got Conv1d"):
        lora.LoRALinear(nn.Conv1d(8, 3, 1), rank=1)


def test_apply_lora_rejects_bad_input_and_leaves_the_model_alone():
    model = _model(GELU)
    with pytest.raises(ValueError, match=r"'gate_proj' matches no nn.Linear in GPT; .*'down_proj'"):
        lora.apply_lora(model, lora.LoRAConfig(targets=("q_proj", "gate_proj")))
    mqa = _model(dataclasses.replace(GELU, n_kv_heads=1))  # k_proj: 32 -> 8
    with pytest.raises(ValueError, match=r"blocks\.0\.attn\.k_proj: rank=16 > min\(d_in, d_out\)"):
        lora.apply_lora(mqa, lora.LoRAConfig(rank=16, targets=("attn",)))
    for m in (model, mqa):  # checked before anything changed
        assert all(p.requires_grad for p in m.parameters())
        assert not any(isinstance(x, lora.LoRALinear) for x in m.modules())
    with pytest.raises(ValueError, match="call apply_lora"):
        lora.merge_lora(model)
    assert lora.apply_lora(model, lora.LoRAConfig()) == ADAPTED_BY_DEFAULT
    with pytest.raises(ValueError, match="already has LoRA layers"):
        lora.apply_lora(model, lora.LoRAConfig(targets=("mlp",)))
    lora.merge_lora(model)
    with pytest.raises(RuntimeError, match="already merged"):
        lora.merge_lora(model)
    lora.unmerge_lora(model)
    with pytest.raises(RuntimeError, match="not merged"):
        lora.unmerge_lora(model)
