"""Tests for course_lib.model.loading.load_weights: a flat dict of weights in either matrix layout.

Reference for which tensors are linear matrices: the parameter names written out here by hand
(``*_proj.weight``, ``lm_head.weight``, ``router.weight``), not the module walk the library
uses. Oracles: a model's own ``state_dict`` (round trip, bit for bit), the same weights
transposed as GPT-2's Conv1D or JAX would store them (identical logits), and the errors.
"""

from __future__ import annotations

import dataclasses
import re

import pytest
import torch

from course_lib import model as M
from course_lib import moe
from course_lib.model import loading

TINY = M.ModelConfig(vocab_size=50, context_length=16, d_model=32, n_layers=2, n_heads=4)
CONFIGS = {
    "gpt2-like": TINY,  # tied head, biases, learned positions
    "llama-like": dataclasses.replace(TINY, n_kv_heads=2, norm="rmsnorm", positional="rope", mlp="swiglu",
                                      tie_embeddings=False, bias=False),
    "moe-post": dataclasses.replace(TINY, norm_position="post", positional="sinusoidal",
                                    moe=moe.MoEConfig(n_experts=3, top_k=2)),
}
LINEAR = re.compile(r"(_proj|lm_head|router)\.weight$")  # the matrices of nn.Linear layers, by name


def _model(config: M.ModelConfig, seed: int = 0) -> M.GPT:
    torch.manual_seed(seed)
    model = M.GPT(config).eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():  # std 0.3 everywhere, so that a transposed matrix shows in the logits
        for p in model.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=g))
    return model


def _ids(seed: int = 1) -> torch.Tensor:
    return torch.randint(0, 50, (2, 12), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("name", list(CONFIGS))
def test_linear_weight_names_are_the_projection_and_head_matrices(name):
    model = M.GPT(CONFIGS[name])
    assert loading.linear_weight_names(model) == {k for k in model.state_dict() if LINEAR.search(k)}
    tied = {"lm_head.weight": "tok_emb.weight"} if CONFIGS[name].tie_embeddings else {}
    assert loading.tied_names(model) == tied


@pytest.mark.parametrize("name", list(CONFIGS))
def test_a_state_dict_round_trips_bit_for_bit(name):
    source, target = _model(CONFIGS[name], seed=0), M.GPT(CONFIGS[name]).eval()
    assert M.load_weights(target, source.state_dict()) is target  # layout="out_in", torch's own
    for (k, a), (k2, b) in zip(source.state_dict().items(), target.state_dict().items(), strict=True):
        assert k == k2 and torch.equal(a, b), k
    with torch.no_grad():
        assert torch.equal(target(_ids())[0], source(_ids())[0])


@pytest.mark.parametrize("name", list(CONFIGS))
def test_in_out_weights_give_the_same_logits(name):
    """Every linear matrix stored as (d_in, d_out), as GPT-2's Conv1D and JAX do; the tied head
    left out (it is the embedding), embeddings and vectors as they are."""
    source = _model(CONFIGS[name], seed=0)
    theirs = {k: (v.T.contiguous() if LINEAR.search(k) else v) for k, v in source.state_dict().items()
              if k not in loading.tied_names(source)}
    target = M.load_weights(M.GPT(CONFIGS[name]).eval(), theirs, layout="in_out")
    with torch.no_grad():
        torch.testing.assert_close(target(_ids())[0], source(_ids())[0], atol=0, rtol=0)
    if CONFIGS[name].tie_embeddings:
        assert target.lm_head.weight is target.tok_emb.weight


def test_a_square_matrix_follows_the_declared_layout():
    """q_proj is (D, D): its shape cannot tell the layouts apart, so the declared one decides
    (a non-square matrix in the wrong layout is caught: see the errors below)."""
    weights = _model(TINY).state_dict()
    q = weights["blocks.0.attn.q_proj.weight"]
    assert q.shape == (32, 32)
    theirs = {k: (v.T if LINEAR.search(k) else v) for k, v in weights.items() if k != "lm_head.weight"}
    assert torch.equal(M.load_weights(M.GPT(TINY), theirs, layout="in_out").blocks[0].attn.q_proj.weight, q)
    mixed = {**theirs, "blocks.0.attn.q_proj.weight": q}  # this one given (d_out, d_in) by mistake:
    loaded = M.load_weights(M.GPT(TINY), mixed, layout="in_out")  # it fits, so it comes in transposed
    assert torch.equal(loaded.blocks[0].attn.q_proj.weight, q.T)


def test_lower_precision_weights_are_cast_to_the_model():
    source = _model(TINY)
    half = {k: v.half() for k, v in source.state_dict().items()}
    target = M.load_weights(M.GPT(TINY), half)
    assert target.tok_emb.weight.dtype == torch.float32
    assert torch.equal(target.tok_emb.weight, source.tok_emb.weight.half().float())


# --------------------------------------------------------------------------- errors
def _weights(config=TINY) -> dict[str, torch.Tensor]:
    return dict(_model(config).state_dict())


def test_missing_and_unexpected_keys_are_named():
    weights = _weights()
    del weights["blocks.1.mlp.up_proj.bias"]
    weights["blocks.2.attn.q_proj.weight"] = torch.zeros(32, 32)
    with pytest.raises(ValueError, match=r"missing 1: blocks\.1\.mlp\.up_proj\.bias; "
                                         r"unexpected 1: blocks\.2\.attn\.q_proj\.weight"):
        M.load_weights(M.GPT(TINY), weights)
    untied = dataclasses.replace(TINY, tie_embeddings=False)
    weights = {k: v for k, v in _weights(untied).items() if k != "lm_head.weight"}
    with pytest.raises(ValueError, match=r"missing 1: lm_head\.weight$"):  # an untied head is its own
        M.load_weights(M.GPT(untied), weights)
    with pytest.raises(ValueError, match=r"missing \d+: .*, \.\.\. \(\d+ in all\)"):  # a long list is cut
        M.load_weights(M.GPT(TINY), {})


def test_a_wrong_shape_names_the_key_and_both_shapes():
    weights = _weights()
    weights["blocks.0.mlp.up_proj.weight"] = weights["blocks.0.mlp.up_proj.weight"][:100]
    with pytest.raises(ValueError, match=r"weights\['blocks\.0\.mlp\.up_proj\.weight'\] has shape "
                                         r"\(100, 32\), expected \(128, 32\); the model's "
                                         r"blocks\.0\.mlp\.up_proj\.weight is \(128, 32\)"):
        M.load_weights(M.GPT(TINY), weights)
    weights = _weights()  # out_in weights declared in_out: the non-square ones do not fit
    with pytest.raises(ValueError, match=r"has shape \(128, 32\), expected \(d_in, d_out\) = \(32, 128\) "
                                         r"for layout='in_out'"):
        M.load_weights(M.GPT(TINY), weights, layout="in_out")
    weights = _weights()
    weights["tok_emb.weight"] = weights["tok_emb.weight"].T  # embeddings are never transposed
    with pytest.raises(ValueError, match=r"'tok_emb\.weight'\] has shape \(32, 50\), expected \(50, 32\)"):
        M.load_weights(M.GPT(TINY), weights, layout="in_out")


def test_other_bad_input_is_refused():
    weights = _weights()
    with pytest.raises(ValueError, match="layout must be one of .*'out_in', 'in_out'.*got 'row_major'"):
        M.load_weights(M.GPT(TINY), weights, layout="row_major")
    with pytest.raises(ValueError, match=r"weights\['norm_f\.bias'\] must be a tensor, got list"):
        M.load_weights(M.GPT(TINY), {**weights, "norm_f.bias": [0.0] * 32})
    with pytest.raises(ValueError, match=r"lm_head\.weight is tied to tok_emb\.weight .* different values"):
        M.load_weights(M.GPT(TINY), {**weights, "lm_head.weight": torch.zeros(50, 32)})
