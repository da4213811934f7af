"""Tests for course_lib.model.

Oracles: HuggingFace ``GPT2LMHeadModel`` and ``LlamaForCausalLM`` built offline from small
random configs, with every weight randomised (norm gains around 1) so that a swapped or
untransposed matrix shows; our model loads their weights and must give the same logits.
Properties: causality, KV-cache decoding == full forward, tied weights are one Parameter,
parameter accounting against ``sum(p.numel())``, post-norm runs and differs, bad input errors.
Conventions met elsewhere, as options: RoPE's interleaved pairing is the default one after
HF's Meta-to-HF permutation of the q and k rows; ``mlp="gelu_exact"`` is the erf GELU (and
HF GPT-2's ``"gelu"``); ``norm_eps`` reaches every norm of every family; a checkpoint saved
before the newer config fields loads.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from course_lib import attention, flops, norms, pretrained
from course_lib import functional as Fn
from course_lib import model as M

TINY = M.ModelConfig(vocab_size=50, context_length=16, d_model=32, n_layers=2, n_heads=4)
VARIANTS = {
    "gpt2-like": TINY,
    "llama-like": dataclasses.replace(TINY, n_kv_heads=2, norm="rmsnorm", positional="rope", mlp="swiglu",
                                      tie_embeddings=False, bias=False),
    "sinusoidal": dataclasses.replace(TINY, positional="sinusoidal"),
    "none-post-sdpa": dataclasses.replace(TINY, positional="none", norm_position="post", attn_impl="sdpa"),
}


def _model(config: M.ModelConfig, seed: int = 0) -> M.GPT:
    torch.manual_seed(seed)
    return M.GPT(config).eval()


def _ids(B: int, S: int, V: int, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, V, (B, S), generator=torch.Generator().manual_seed(seed))


def _randomise(hf_model) -> None:
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in hf_model.named_parameters():
            is_gain = p.dim() == 1 and ("ln" in name or "norm" in name) and name.endswith("weight")
            p.copy_((1.0 if is_gain else 0.0) + 0.2 * torch.randn(p.shape, generator=g))


# --------------------------------------------------------------------------- HuggingFace parity
@pytest.mark.parametrize(("activation", "mlp"), [("gelu_new", "gelu"), ("gelu", "gelu_exact"),
                                                 ("gelu_pytorch_tanh", "gelu")])
def test_gpt2_parity_with_huggingface(activation, mlp):
    """GPT-2's own activation is ``gelu_new`` (tanh); HF's ``gelu`` is the exact one."""
    transformers = pytest.importorskip("transformers")
    cfg = transformers.GPT2Config(n_layer=2, n_head=4, n_embd=64, vocab_size=100, n_positions=32,
                                  resid_pdrop=0, embd_pdrop=0, attn_pdrop=0, bos_token_id=0, eos_token_id=0,
                                  activation_function=activation)
    hf = transformers.GPT2LMHeadModel._from_config(cfg, attn_implementation="eager").eval()
    _randomise(hf)
    ours = M.from_hf_gpt2(hf)
    c = ours.config
    assert (c.positional, c.norm, c.mlp, c.tie_embeddings, c.bias) == (
        "learned", "layernorm", mlp, True, True)
    assert ours.num_params() == sum(p.numel() for p in hf.parameters())
    ids = _ids(3, 32, 100)
    with torch.no_grad():
        expected = hf(ids).logits
        got, _ = ours(ids)
    assert expected.abs().max() > 1.0  # the comparison is not between near-zero numbers
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def test_gpt2_with_another_activation_is_refused():
    transformers = pytest.importorskip("transformers")
    cfg = transformers.GPT2Config(n_layer=1, n_head=2, n_embd=8, vocab_size=10, n_positions=8,
                                  activation_function="relu")
    hf = transformers.GPT2LMHeadModel._from_config(cfg)
    with pytest.raises(ValueError, match="activation_function must be one of .*got 'relu'"):
        M.from_hf_gpt2(hf)


def test_llama_parity_with_huggingface():
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, vocab_size=100,
                                   max_position_embeddings=64, rms_norm_eps=1e-6, tie_word_embeddings=False,
                                   attention_bias=False, bos_token_id=0, eos_token_id=0)
    hf = transformers.LlamaForCausalLM._from_config(cfg, attn_implementation="eager").eval()
    _randomise(hf)
    ours = M.from_hf_llama(hf)
    c = ours.config
    assert (c.positional, c.norm, c.mlp, c.kv_heads, c.tie_embeddings, c.bias) == (
        "rope", "rmsnorm", "swiglu", 2, False, False)
    assert c.rope_base == 10000.0 and c.norm_eps == 1e-6
    assert ours.num_params() == sum(p.numel() for p in hf.parameters())
    ids = _ids(2, 64, 100)
    with torch.no_grad():
        expected = hf(ids).logits
        got, _ = ours(ids)
    assert expected.abs().max() > 1.0
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)


# --------------------------------------------------------------------------- properties
@pytest.mark.parametrize("name", list(VARIANTS))
def test_causality_a_later_token_leaves_earlier_logits_unchanged(name):
    model = _model(VARIANTS[name])
    ids = _ids(2, 10, 50)
    changed = ids.clone()
    changed[:, 6] = (changed[:, 6] + 1) % 50
    with torch.no_grad():
        a, _ = model(ids)
        b, _ = model(changed)
    torch.testing.assert_close(a[:, :6], b[:, :6])
    assert not torch.allclose(a[:, 6:], b[:, 6:])


@pytest.mark.parametrize("name", ["gpt2-like", "llama-like", "sinusoidal"])
def test_incremental_decoding_with_caches_equals_full_forward(name):
    model = _model(VARIANTS[name])
    ids = _ids(2, 16, 50)
    with torch.no_grad():
        full, _ = model(ids)
        caches = model.make_caches(2)
        assert len(caches) == 2 and isinstance(caches[0], attention.KVCache)
        prefill, _ = model(ids[:, :5], caches=caches)  # multi-token prefill, then one at a time
        steps = [model(ids[:, t:t + 1], caches=caches)[0] for t in range(5, 16)]
    assert caches[0].length == 16
    torch.testing.assert_close(torch.cat([prefill, *steps], dim=1), full, atol=1e-5, rtol=1e-5)


def test_tied_and_untied_embeddings():
    tied = _model(TINY)
    assert tied.lm_head.weight is tied.tok_emb.weight
    untied = _model(dataclasses.replace(TINY, tie_embeddings=False))
    assert untied.lm_head.weight is not untied.tok_emb.weight
    V, D = TINY.vocab_size, TINY.d_model
    assert untied.num_params() - tied.num_params() == V * D


@pytest.mark.parametrize("name", list(VARIANTS))
def test_num_params_counts_each_parameter_once(name):
    model = _model(VARIANTS[name])
    unique = {id(p): p for p in model.parameters()}
    assert model.num_params() == sum(p.numel() for p in unique.values())
    embeddings = model.tok_emb.weight.numel()
    if model.pos_emb is not None:
        embeddings += model.pos_emb.embedding.weight.numel()
    assert model.num_params(non_embedding=True) == model.num_params() - embeddings


def test_gpt2_like_parameter_count_by_hand():
    """L (4 D^2 + 4 D attention with biases + 8 D^2 + 5 D MLP + 4 D two LayerNorms)
    + V D tokens + C D positions + 2 D final norm; tied head adds nothing."""
    V, C, D, L = 50, 16, 32, 2
    per_block = (4 * D * D + 4 * D) + (8 * D * D + 4 * D + D) + 4 * D
    assert _model(TINY).num_params() == L * per_block + V * D + C * D + 2 * D


def test_swiglu_width_default_and_init():
    cfg = dataclasses.replace(TINY, mlp="swiglu")
    assert cfg.ff_width == 88  # 8 * 32 / 3 = 85.3, rounded up to a multiple of 8
    assert dataclasses.replace(TINY, d_ff=10).ff_width == 10 and TINY.ff_width == 128
    model = _model(cfg)
    mlp = model.blocks[0].mlp
    assert mlp.gate_proj.weight.shape == (88, 32) and mlp.down_proj.weight.shape == (32, 88)
    assert torch.all(mlp.up_proj.bias == 0)
    assert 0.015 < mlp.up_proj.weight.std().item() < 0.025  # N(0, 0.02)


def test_post_norm_runs_and_differs_from_pre_norm():
    pre, post = _model(TINY), _model(dataclasses.replace(TINY, norm_position="post"))
    assert isinstance(post.norm_f, torch.nn.Identity)
    post.load_state_dict(pre.state_dict(), strict=False)  # same weights, different wiring
    ids = _ids(2, 8, 50)
    targets = _ids(2, 8, 50, seed=3)
    a, _ = pre(ids)
    b, loss = post(ids, targets)
    assert torch.isfinite(b).all() and not torch.allclose(a, b)
    loss.backward()
    assert all(p.grad is not None for p in post.parameters())


def test_loss_is_mean_cross_entropy_and_ignores_minus_100():
    model = _model(TINY)
    ids, targets = _ids(2, 8, 50), _ids(2, 8, 50, seed=3)
    targets[0, :3] = -100
    logits, loss = model(ids, targets)
    keep = targets != -100
    expected = -torch.log_softmax(logits, -1)[keep].gather(-1, targets[keep][:, None]).mean()
    torch.testing.assert_close(loss, expected)
    assert model(ids)[1] is None


def test_sdpa_and_naive_attention_give_the_same_logits():
    naive = _model(TINY)
    sdpa = _model(dataclasses.replace(TINY, attn_impl="sdpa"))
    sdpa.load_state_dict(naive.state_dict())
    ids = _ids(2, 16, 50)
    torch.testing.assert_close(sdpa(ids)[0], naive(ids)[0], atol=1e-5, rtol=1e-5)


# --------------------------------------------------------------------------- left padding
PROMPTS = [[3, 1, 4], [1, 5, 9, 2, 6, 5, 3], [5]]  # lengths 3, 7, 1


def _left_padded(prompts: list[list[int]], pad_id: int = 7) -> tuple[torch.Tensor, torch.Tensor]:
    """Written out here so that these tests do not lean on generation.left_pad."""
    S = max(len(p) for p in prompts)
    idx = torch.full((len(prompts), S), pad_id)
    mask = torch.zeros(len(prompts), S, dtype=torch.bool)
    for b, p in enumerate(prompts):
        idx[b, S - len(p):], mask[b, S - len(p):] = torch.tensor(p), True
    return idx, mask


@pytest.mark.parametrize("name", ["gpt2-like", "llama-like", "sinusoidal"])
def test_left_padded_batch_gives_each_prompt_its_logits_alone(name):
    model = _model(VARIANTS[name])
    idx, mask = _left_padded(PROMPTS)
    with torch.no_grad():
        logits, _ = model(idx, padding_mask=mask)
        unmasked, _ = model(idx)
        for b, p in enumerate(PROMPTS):
            alone, _ = model(torch.tensor([p]))
            torch.testing.assert_close(logits[b, -len(p):], alone[0], atol=1e-5, rtol=1e-5)
    assert torch.isfinite(logits).all()  # pad positions (garbage) are still numbers, not NaN
    assert not torch.allclose(unmasked[2, -1:], logits[2, -1:], atol=1e-3)  # the mask matters


@pytest.mark.parametrize("name", ["gpt2-like", "llama-like"])
def test_left_padded_batch_with_caches_gives_each_prompt_its_logits_alone(name):
    model = _model(VARIANTS[name])
    idx, mask = _left_padded(PROMPTS)
    new = _ids(3, 5, 50)  # five more tokens per row, fed one at a time
    with torch.no_grad():
        caches = model.make_caches(3)
        steps = [model(idx, caches=caches, padding_mask=mask)[0]]  # prefill: (3, 7, V)
        for t in range(5):
            mask = torch.cat([mask, torch.ones(3, 1, dtype=torch.bool)], dim=1)  # (B, Sk + 1)
            steps.append(model(new[:, t:t + 1], caches=caches, padding_mask=mask)[0])
        logits = torch.cat(steps, dim=1)  # (3, 12, V)
        for b, p in enumerate(PROMPTS):
            alone, _ = model(torch.cat([torch.tensor(p), new[b]])[None])  # (1, len(p) + 5, V)
            torch.testing.assert_close(logits[b, -alone.shape[1]:], alone[0], atol=1e-5, rtol=1e-5)
    assert caches[0].length == 12


def test_attention_takes_per_row_rotary_positions():
    """Row b with positions ``(arange(S) - b).clamp(min=0)`` (b left pads) is row b run alone
    with those (S,) positions; ``positions=arange(S)`` is the default. (A uniform shift would
    change nothing: RoPE only sees offsets.)"""
    model = _model(VARIANTS["llama-like"])
    attn, rotary = model.blocks[0].attn, model.rotary
    x = torch.randn(3, 5, 32, generator=torch.Generator().manual_seed(2))
    mask = attention.causal_mask(5)
    with torch.no_grad():
        default = attn(x, mask=mask, rotary=rotary)
        torch.testing.assert_close(attn(x, mask=mask, rotary=rotary, positions=torch.arange(5)), default)
        positions = (torch.arange(5) - torch.arange(3)[:, None]).clamp(min=0)  # (3, 5)
        per_row = attn(x, mask=mask, rotary=rotary, positions=positions)
        for b in range(3):
            alone = attn(x[b:b + 1], mask=mask, rotary=rotary, positions=positions[b])
            torch.testing.assert_close(per_row[b], alone[0])
    assert not torch.allclose(per_row[2], default[2])
    with pytest.raises(ValueError, match=r"positions must be \(S=5,\) or \(B=3, S=5\)"):
        attn(x, mask=mask, rotary=rotary, positions=torch.arange(4))
    with pytest.raises(ValueError, match="cross-attention"):
        attn(x, x, positions=torch.arange(5))


def test_padding_mask_errors_name_the_bad_value():
    model = _model(TINY)
    idx, mask = _left_padded(PROMPTS)
    with pytest.raises(ValueError, match=r"padding_mask must be a bool \(B, Sk\) = \(3, 7\).*shape \(3, 6\)"):
        model(idx, padding_mask=mask[:, 1:])
    with pytest.raises(ValueError, match="dtype torch.int64"):
        model(idx, padding_mask=mask.long())
    empty = mask.clone()
    empty[2] = False
    with pytest.raises(ValueError, match=r"rows \[2\] have no real token"):
        model(idx, padding_mask=empty)
    caches = model.make_caches(3)
    model(idx, caches=caches, padding_mask=mask)
    with pytest.raises(ValueError, match=r"\(3, 8\).*7 cached \+ 1 new"):  # the new column only: too short
        model(idx[:, :1], caches=caches, padding_mask=mask[:, :1])


# --------------------------------------------------------------------------- errors
@pytest.mark.parametrize("kwargs,match", [
    (dict(d_model=30), "d_model=30"),
    (dict(n_kv_heads=3), "n_kv_heads=3"),
    (dict(norm="batchnorm"), "batchnorm"),
    (dict(norm_position="middle"), "middle"),
    (dict(positional="alibi"), "alibi"),
    (dict(mlp="relu"), "relu"),
    (dict(vocab_size=0), "vocab_size"),
    (dict(n_layers=-1), "n_layers"),
    (dict(dropout=1.0), "dropout"),
    (dict(d_ff=0), "d_ff"),
    (dict(rope_pairing="neox"), "rope_pairing must be one of .*'neox'"),
    (dict(mlp="gelu_tanh"), "mlp must be one of .*'gelu_exact'.*'gelu_tanh'"),
    (dict(norm_eps=-1e-5), "norm_eps must be >= 0 .*-1e-05"),
    (dict(rope_base=0.0), "rope_base must be > 0"),
])
def test_config_validation_names_the_bad_value(kwargs, match):
    with pytest.raises(ValueError, match=match):
        dataclasses.replace(TINY, **kwargs)


def test_forward_errors_name_the_bad_value():
    model = _model(TINY)
    with pytest.raises(ValueError, match="torch.long"):
        model(torch.zeros(2, 3))
    with pytest.raises(ValueError, match=r"\(B, S\)"):
        model(torch.zeros(3, dtype=torch.long))
    with pytest.raises(ValueError, match="context_length=16"):
        model(torch.zeros(1, 17, dtype=torch.long))
    with pytest.raises(ValueError, match="max 50"):
        model(torch.tensor([[1, 50]]))
    with pytest.raises(ValueError, match="targets"):
        model(torch.zeros(1, 4, dtype=torch.long), torch.zeros(1, 3, dtype=torch.long))
    caches = model.make_caches(1)
    model(torch.zeros(1, 16, dtype=torch.long), caches=caches)
    with pytest.raises(ValueError, match="16 cached"):
        model(torch.zeros(1, 1, dtype=torch.long), caches=caches)


# --------------------------------------------------------------------------- conventions met elsewhere
def _spread(model: nn.Module, seed: int = 0) -> nn.Module:
    """Weights of std 0.3 (gains around 1), so that a wrong layout changes the logits visibly."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            gain = p.dim() == 1 and "norm" in name and name.endswith("weight")
            p.copy_((1.0 if gain else 0.0) + 0.3 * torch.randn(p.shape, generator=g))
    return model


def _interleaved_to_halves(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """The rows of a q or k projection (weight ``(H Dh, D)`` or bias ``(H Dh,)``), head by head,
    from interleaved pairs (2i, 2i+1) to halves (i, i + Dh/2): HF's ``permute`` in
    ``convert_llama_weights_to_hf.py``, written as it does (view, transpose)."""
    rows, rest = w.shape[0], w.shape[1:]
    return w.reshape(n_heads, rows // n_heads // 2, 2, *rest).transpose(1, 2).reshape(rows, *rest)


@pytest.mark.parametrize(("bias", "n_kv_heads"), [(False, 2), (True, None), (False, 1)])
def test_rope_pairings_are_one_model_after_permuting_the_q_and_k_rows(bias, n_kv_heads):
    """Meta's Llama checkpoints (interleaved) become HF's (halves) by permuting the rows of
    q_proj and k_proj within each head; nothing else changes, and the logits are the same."""
    config = dataclasses.replace(VARIANTS["llama-like"], rope_pairing="interleaved", bias=bias,
                                 n_kv_heads=n_kv_heads)
    interleaved = _spread(M.GPT(config).eval())
    halves = M.GPT(dataclasses.replace(config, rope_pairing="halves")).eval()
    assert halves.rotary.pairing == "halves" and interleaved.rotary.pairing == "interleaved"
    weights = interleaved.state_dict()
    for name in weights:
        if ".attn.q_proj." in name:
            weights[name] = _interleaved_to_halves(weights[name], config.n_heads)
        elif ".attn.k_proj." in name:
            weights[name] = _interleaved_to_halves(weights[name], config.kv_heads)
    halves.load_state_dict(weights)
    ids = _ids(2, 16, 50)
    with torch.no_grad():
        want = interleaved(ids)[0]
        torch.testing.assert_close(halves(ids)[0], want, atol=1e-5, rtol=1e-5)
        halves.load_state_dict(interleaved.state_dict())  # the same weights unpermuted: another model
        assert (halves(ids)[0] - want).abs().max() > 0.1


def test_rope_pairing_reaches_every_stack():
    config = dataclasses.replace(VARIANTS["llama-like"], rope_pairing="interleaved", rope_base=500.0)
    for rotary in (M.GPT(config).rotary, M.MaskedLM(config).encoder.rotary,
                   M.EncoderDecoder(config).rotary, M.EncoderDecoder(config).encoder.rotary):
        assert (rotary.pairing, rotary.base, rotary.head_dim) == ("interleaved", 500.0, 8)


def test_gelu_exact_mlp_is_the_erf_gelu():
    """The MLP against float64 references: torch's exact GELU and course_lib.functional's, on
    pre-activations from -10 to 10 (weights of std 1); the tanh kind differs from them."""
    config = dataclasses.replace(TINY, mlp="gelu_exact")
    assert config.ff_width == TINY.ff_width == 4 * 32  # the d_ff rule of GELU
    torch.manual_seed(0)
    exact = M.MLP(config)
    with torch.no_grad():
        exact.up_proj.weight.normal_(0.0, 1.0)
    x = torch.cat([torch.randn(2, 6, 32), torch.zeros(1, 6, 32)])  # zero rows: GELU(bias) only
    up, down = exact.up_proj, exact.down_proj
    h = F.linear(x.double(), up.weight.double(), up.bias.double())  # (B, S, F) float64

    def down64(a):
        return F.linear(a, down.weight.double(), down.bias.double())  # (B, S, F) -> (B, S, D)

    assert h.min() < -5 and h.max() > 5
    with torch.no_grad():
        got = exact(x)
        torch.testing.assert_close(got.double(), down64(F.gelu(h, approximate="none")), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(got.double(), down64(Fn.gelu(h)), atol=1e-5, rtol=1e-5)
        tanh = M.MLP(TINY)
        tanh.load_state_dict(exact.state_dict())
        assert (tanh(x) - got).abs().max() > 1e-4  # the tanh form is another function
        want = down64(F.gelu(h, approximate="tanh"))
        torch.testing.assert_close(tanh(x).double(), want, atol=1e-5, rtol=1e-5)
    assert flops.param_count(config) == flops.param_count(TINY)
    assert M.GPT(config).num_params() == M.GPT(TINY).num_params()


_NORMS = (norms.LayerNorm, norms.RMSNorm, nn.LayerNorm, nn.RMSNorm)


@pytest.mark.parametrize("position", ["pre", "post"])
@pytest.mark.parametrize(("norm", "eps", "want"), [("layernorm", None, 1e-5), ("rmsnorm", None, 1e-6),
                                                   ("layernorm", 1e-12, 1e-12), ("rmsnorm", 1e-3, 1e-3)])
def test_norm_eps_reaches_every_norm_of_every_family(norm, eps, want, position):
    """Defaults as documented (1e-5 LayerNorm as GPT-2, 1e-6 RMSNorm as Llama), or the config's;
    the count shows no norm is built elsewhere: 2 per block (3 per decoder block) + a final one
    per pre-norm stack."""
    config = dataclasses.replace(TINY, norm=norm, norm_eps=eps, norm_position=position)
    L, final = config.n_layers, int(position == "pre")
    kind = norms.LayerNorm if norm == "layernorm" else norms.RMSNorm
    for family, count in ((M.GPT, 2 * L + final), (M.MaskedLM, 2 * L + final),
                          (M.EncoderDecoder, 2 * L + final + 3 * L + final)):
        found = [m for m in family(config).modules() if isinstance(m, _NORMS)]
        assert len(found) == count, family.__name__
        assert all(type(m) is kind and m.eps == want for m in found), family.__name__


def test_a_checkpoint_saved_before_the_newer_fields_still_loads():
    path = pretrained.CHECKPOINT_DIR / "shakespeare_char.pt"
    ckpt = torch.load(path, map_location="cpu", weights_only=True)
    stored = ckpt["model_config"]
    assert not {"rope_pairing", "moe"} & set(stored)  # written before these fields existed
    config = M.ModelConfig(**stored)
    assert (config.rope_pairing, config.mlp, config.moe) == ("halves", "gelu", None)
    M.GPT(config).load_state_dict(ckpt["state_dict"])  # strict: every parameter name unchanged
    for name, config in VARIANTS.items():
        older = {k: v for k, v in dataclasses.asdict(config).items() if k not in ("rope_pairing", "moe")}
        assert M.ModelConfig(**older) == config, name
