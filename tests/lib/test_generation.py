"""Tests for course_lib.generation.

Hand-worked filters; greedy against an argmax chain of full forwards; cache == no cache for
the same seed (past the context length too); temperature -> 0 is greedy; stop tokens; beam
search with width 1 == greedy; and beam search beating greedy on a tiny "model" whose
next-token table is written out below.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from course_lib import generation as G
from course_lib import model as M

TINY = M.ModelConfig(vocab_size=20, context_length=12, d_model=32, n_layers=2, n_heads=4)
ROPE = dataclasses.replace(TINY, positional="rope", norm="rmsnorm", mlp="swiglu", n_kv_heads=2, bias=False)
PROMPT = torch.tensor([[1, 2, 3], [4, 5, 6]])


def _model(config: M.ModelConfig) -> M.GPT:
    torch.manual_seed(0)
    return M.GPT(config).eval()


# --------------------------------------------------------------------------- pure helpers
def test_top_k_filter_by_hand():
    logits = torch.tensor([[1.0, 4.0, 2.0, 3.0], [0.0, 0.0, 1.0, -1.0]])
    inf = float("-inf")
    out = G.top_k_filter(logits, 2)
    assert torch.equal(out[0], torch.tensor([inf, 4.0, inf, 3.0]))
    assert torch.equal(out[1], torch.tensor([0.0, 0.0, 1.0, inf]))  # 1 and the tied 0s
    assert torch.equal(G.top_k_filter(logits, 1)[0], torch.tensor([inf, 4.0, inf, inf]))
    assert torch.equal(G.top_k_filter(logits, 10), logits) and G.top_k_filter(logits, None) is logits
    with pytest.raises(ValueError, match="top_k"):
        G.top_k_filter(logits, 0)


def test_top_p_filter_by_hand():
    """probs (0.1, 0.6, 0.3): sorted 0.6, 0.3, 0.1 with mass before them 0, 0.6, 0.9.
    p = 0.5 keeps only 0.6 (the top token always stays); p = 0.7 keeps 0.6 and 0.3;
    p = 0.9 keeps 0.6 and 0.3 (0.6 + 0.3 = 0.9 >= 0.9, up to rounding); p = 0.95 keeps all."""
    logits = torch.tensor([[0.1, 0.6, 0.3]]).log()
    kept = lambda p: torch.isfinite(G.top_p_filter(logits, p))[0].tolist()  # noqa: E731
    assert kept(0.5) == [False, True, False]
    assert kept(0.01) == [False, True, False]
    assert kept(0.7) == [False, True, True]
    assert kept(0.95) == [True, True, True]
    assert kept(1.0) == [True, True, True]
    for p in (0.0, 1.5):
        with pytest.raises(ValueError, match="top_p"):
            G.top_p_filter(logits, p)


def test_sample_next_greedy_temperature_and_filters():
    logits = torch.tensor([[0.0, 3.0, 2.9, -1.0]])
    assert G.sample_next(logits, greedy=True).tolist() == [1]
    assert G.sample_next(logits, temperature=0.0).tolist() == [1]
    g = torch.Generator().manual_seed(0)
    draws = torch.stack([G.sample_next(logits, top_k=2, generator=g) for _ in range(200)])
    assert set(draws.flatten().tolist()) == {1, 2}  # top-k = 2 never draws 0 or 3
    draws = torch.stack([G.sample_next(logits, temperature=1e-3, generator=g) for _ in range(50)])
    assert set(draws.flatten().tolist()) == {1}  # T -> 0 is greedy
    with pytest.raises(ValueError, match="temperature"):
        G.sample_next(logits, temperature=-1.0)


# --------------------------------------------------------------------------- generate
@pytest.mark.parametrize("config", [TINY, ROPE], ids=["learned", "rope"])
def test_greedy_equals_an_argmax_chain_of_full_forwards(config):
    model = _model(config)
    out = G.generate(model, PROMPT, 6, greedy=True)
    seq = PROMPT.clone()
    with torch.no_grad():
        for _ in range(6):
            nxt = model(seq)[0][:, -1].argmax(-1)
            seq = torch.cat([seq, nxt[:, None]], dim=1)
    assert torch.equal(out, seq)


@pytest.mark.parametrize("config", [TINY, ROPE], ids=["learned", "rope"])
@pytest.mark.parametrize("n_new", [5, 14], ids=["within", "past-context"])
def test_cache_and_no_cache_give_the_same_tokens_for_the_same_seed(config, n_new):
    model = _model(config)
    kw = dict(temperature=1.5, top_k=15, top_p=0.95)
    a = G.generate(model, PROMPT, n_new, use_cache=True, generator=torch.Generator().manual_seed(7), **kw)
    b = G.generate(model, PROMPT, n_new, use_cache=False, generator=torch.Generator().manual_seed(7), **kw)
    assert a.shape == (2, 3 + n_new) and torch.equal(a, b)
    c = G.generate(model, PROMPT, n_new, use_cache=True, generator=torch.Generator().manual_seed(8), **kw)
    assert not torch.equal(a, c)  # the seed matters: the test is not trivially greedy


def test_low_temperature_approaches_greedy():
    model = _model(TINY)
    greedy = G.generate(model, PROMPT, 6, greedy=True)
    for seed in range(3):
        cold = G.generate(model, PROMPT, 6, temperature=1e-4, generator=torch.Generator().manual_seed(seed))
        assert torch.equal(cold, greedy)


def _padded_after_stop(free: torch.Tensor, stops: list[int], prompt_len: int) -> torch.Tensor:
    """What stop tokens should do to a free run: after a row's first stop token, repeat it."""
    out = free.clone()
    for row in out:
        hits = [t for t in range(prompt_len, len(row)) if int(row[t]) in stops]
        if hits:
            row[hits[0]:] = row[hits[0]]
    return out


def test_stop_tokens_pad_a_finished_row_and_end_the_loop():
    model = _model(TINY)
    free = G.generate(model, PROMPT, 8, greedy=True)
    stops = [int(free[0, 5])]  # row 0 emits it at step 2 or earlier
    out = G.generate(model, PROMPT, 8, greedy=True, stop_tokens=stops)
    expected = _padded_after_stop(free, stops, 3)
    assert torch.equal(out, expected[:, :out.shape[1]])
    all_stopped = [t for t in range(3, 11) if all(any(int(x) in stops for x in row[3:t + 1]) for row in free)]
    assert out.shape[1] == (all_stopped[0] + 1 if all_stopped else 11)
    # both rows stop at their first new token -> the loop ends after one step
    short = G.generate(model, PROMPT, 8, greedy=True, stop_tokens=free[:, 3].tolist())
    assert short.shape == (2, 4) and torch.equal(short, free[:, :4])


def test_generate_keeps_the_training_mode_and_checks_inputs():
    model = _model(TINY).train()
    G.generate(model, PROMPT, 2)
    assert model.training
    with pytest.raises(ValueError, match="idx"):
        G.generate(model, torch.tensor([1, 2]), 2)
    with pytest.raises(ValueError, match="max_new_tokens"):
        G.generate(model, PROMPT, -1)


# --------------------------------------------------------------------------- left padding
PROMPTS = [[1, 2], [4, 5, 6, 7, 8], [9, 10, 11, 12, 13, 14, 15]]  # lengths 2, 5, 7


def _lively_model(config: M.ModelConfig) -> M.GPT:
    """Weights ~ N(0, 0.3) (norm gains around 1): at GPT-2's init std 0.02 greedy decoding
    just repeats the last token, whatever came before, and would prove nothing about padding."""
    model, g = _model(config), torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            is_gain = p.dim() == 1 and "norm" in name and name.endswith("weight")
            p.copy_((1.0 if is_gain else 0.0) + 0.3 * torch.randn(p.shape, generator=g))
    return model


def test_left_pad_by_hand_and_errors():
    idx, mask = G.left_pad([torch.tensor([5, 6]), [7], [1, 2, 3]], pad_id=9)
    assert idx.tolist() == [[9, 5, 6], [9, 9, 7], [1, 2, 3]] and idx.dtype == torch.long
    assert mask.tolist() == [[False, True, True], [False, False, True], [True, True, True]]
    with pytest.raises(ValueError, match="at least one prompt"):
        G.left_pad([])
    with pytest.raises(ValueError, match=r"prompts \[1\]"):
        G.left_pad([[1, 2], []])
    with pytest.raises(ValueError, match=r"prompts \[0\].*\(1, 2\)"):
        G.left_pad([torch.tensor([[1, 2]])])


def _alone(model, n_new: int, **kw) -> list[torch.Tensor]:
    return [G.generate(model, torch.tensor([p]), n_new, **kw)[0] for p in PROMPTS]


@pytest.mark.parametrize("config", [TINY, ROPE], ids=["learned", "rope"])
@pytest.mark.parametrize("use_cache", [True, False], ids=["cache", "no-cache"])
@pytest.mark.parametrize("n_new", [4, 12], ids=["within", "past-context"])
def test_greedy_on_a_left_padded_batch_gives_each_prompt_its_tokens_alone(config, use_cache, n_new):
    """7 + 12 = 19 > context_length 12: past it, the batch (and every row alone but the
    shortest's first steps) continues on a sliding window whose mask is sliced with it."""
    model = _lively_model(config)
    idx, mask = G.left_pad(PROMPTS, pad_id=3)
    out = G.generate(model, idx, n_new, greedy=True, use_cache=use_cache, padding_mask=mask)
    assert out.shape == (3, 7 + n_new)
    for b, alone in enumerate(_alone(model, n_new, greedy=True, use_cache=use_cache)):
        assert torch.equal(out[b, 7 - len(PROMPTS[b]):], alone)
        assert torch.equal(out[b, :7 - len(PROMPTS[b])], torch.full((7 - len(PROMPTS[b]),), 3))  # pads kept
    unmasked = G.generate(model, idx, n_new, greedy=True, use_cache=use_cache)
    assert not torch.equal(unmasked, out)  # without the mask the pads change the tokens


@pytest.mark.parametrize("config", [TINY, ROPE], ids=["learned", "rope"])
def test_an_all_true_padding_mask_changes_nothing(config):
    model = _lively_model(config)
    all_real = torch.ones_like(PROMPT, dtype=torch.bool)
    plain = G.generate(model, PROMPT, 12, greedy=True)
    assert torch.equal(G.generate(model, PROMPT, 12, greedy=True, padding_mask=all_real), plain)


@pytest.mark.parametrize("config", [TINY, ROPE], ids=["learned", "rope"])
@pytest.mark.parametrize("n_new", [4, 12], ids=["within", "past-context"])
def test_left_padded_sampling_same_seed_same_tokens_with_and_without_cache(config, n_new):
    model = _lively_model(config)
    idx, mask = G.left_pad(PROMPTS)
    kw = dict(temperature=1.5, top_k=15, top_p=0.95, padding_mask=mask)
    a = G.generate(model, idx, n_new, use_cache=True, generator=torch.Generator().manual_seed(7), **kw)
    b = G.generate(model, idx, n_new, use_cache=False, generator=torch.Generator().manual_seed(7), **kw)
    assert a.shape == (3, 7 + n_new) and torch.equal(a, b)
    c = G.generate(model, idx, n_new, use_cache=True, generator=torch.Generator().manual_seed(8), **kw)
    assert not torch.equal(a, c)


def test_stop_tokens_per_row_in_a_left_padded_batch():
    model = _lively_model(ROPE)
    idx, mask = G.left_pad(PROMPTS)
    free = G.generate(model, idx, 8, greedy=True, padding_mask=mask)
    stops = [int(free[1, 8])]  # row 1's second new token
    out = G.generate(model, idx, 8, greedy=True, padding_mask=mask, stop_tokens=stops)
    expected = _padded_after_stop(free, stops, 7)
    assert not torch.equal(expected, free)  # the stop token cuts at least row 1
    assert torch.equal(out, expected[:, :out.shape[1]])
    for b, alone in enumerate(_alone(model, 8, greedy=True, stop_tokens=stops)):
        row = out[b, 7 - len(PROMPTS[b]):]
        n = min(len(row), len(alone))  # alone, a row stops the loop by itself
        assert torch.equal(row[:n], alone[:n])


def test_generate_checks_the_padding_mask():
    model = _model(TINY)
    idx, mask = G.left_pad(PROMPTS)
    with pytest.raises(ValueError, match=r"padding_mask must be a bool tensor of idx's shape \(3, 7\)"):
        G.generate(model, idx, 2, padding_mask=mask[:, 1:])
    with pytest.raises(ValueError, match="dtype torch.int64"):
        G.generate(model, idx, 2, padding_mask=mask.long())
    right = torch.zeros_like(mask)
    right[:, :2] = True  # right padding: the prompts do not all end in the last column
    with pytest.raises(ValueError, match="last column"):
        G.generate(model, idx, 2, padding_mask=right)
    no_real = mask.clone()
    no_real[0] = False
    with pytest.raises(ValueError, match="last column"):
        G.generate(model, idx, 2, padding_mask=no_real)


# --------------------------------------------------------------------------- beam search
class TableModel(torch.nn.Module):
    """Next-token probabilities depend only on the last token (a bigram table)::

        after 0:  1 -> 0.5, 2 -> 0.4, 3 -> 0.1     greedy takes 1 ...
        after 1:  0.25 each                        ... and then has at best 0.25
        after 2:  3 -> 0.9, others 0.1 / 3          beam: 0.4 * 0.9 = 0.36 > 0.5 * 0.25 = 0.125
        after 3:  3 -> 1 (almost)
    """

    def __init__(self):
        super().__init__()
        eps = 1e-6
        table = torch.tensor([
            [eps, 0.5, 0.4, 0.1],
            [0.25, 0.25, 0.25, 0.25],
            [0.1 / 3, 0.1 / 3, 0.1 / 3, 0.9],
            [eps, eps, eps, 1.0],
        ])
        self.register_buffer("log_table", table.log())
        self.config = M.ModelConfig(vocab_size=4, context_length=16)

    def forward(self, idx, targets=None, *, caches=None):
        return self.log_table[idx], None  # (B, S) -> (B, S, V)


def _log_prob(model, seq, prompt_len):
    logp = torch.log_softmax(model(seq)[0][0], -1)
    return sum(logp[t - 1, seq[0, t]].item() for t in range(prompt_len, seq.shape[1]))


def test_beam_search_finds_a_more_likely_sequence_than_greedy():
    model, prompt = TableModel(), torch.tensor([[0]])
    greedy = G.generate(model, prompt, 2, greedy=True, use_cache=False)
    beam = G.beam_search(model, prompt, 2, beam_width=2, length_penalty=0.0)
    assert greedy[0, 1] == 1  # greedy takes the 0.5 first
    assert beam.tolist() == [[0, 2, 3]]
    assert math.isclose(_log_prob(model, beam, 1), math.log(0.36), rel_tol=1e-4)
    assert _log_prob(model, beam, 1) > _log_prob(model, greedy, 1)


@pytest.mark.parametrize("stop", [None, "emitted"])
def test_beam_width_one_is_greedy(stop):
    model = _model(ROPE)
    prompt = PROMPT[:1]
    greedy = G.generate(model, prompt, 7, greedy=True)
    stop_tokens = None if stop is None else [int(greedy[0, 6])]
    greedy = G.generate(model, prompt, 7, greedy=True, stop_tokens=stop_tokens)
    beam = G.beam_search(model, prompt, 7, beam_width=1, stop_tokens=stop_tokens)
    assert torch.equal(beam, greedy[:, :beam.shape[1]]) and beam.shape == greedy.shape


def test_beam_search_stop_tokens_and_errors():
    model, prompt = TableModel(), torch.tensor([[0]])
    # with 3 as a stop token, "0 2 3" finishes after two tokens and wins
    out = G.beam_search(model, prompt, 5, beam_width=2, stop_tokens=[3])
    assert out.tolist() == [[0, 2, 3]]
    assert torch.equal(G.beam_search(model, prompt, 0, beam_width=2), prompt)
    with pytest.raises(ValueError, match="batch size 2"):
        G.beam_search(model, torch.zeros(2, 1, dtype=torch.long), 2, beam_width=2)
    with pytest.raises(ValueError, match="beam_width"):
        G.beam_search(model, prompt, 2, beam_width=0)
