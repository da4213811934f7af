"""Tests for the encoder-only and encoder-decoder models in course_lib.model (chapter 03).

Oracles: ``torch.nn.TransformerEncoderLayer`` and ``torch.nn.TransformerDecoderLayer`` with our
weights copied in (q, k, v packed into ``in_proj_weight``); a padded row against the same row
run alone. Properties: MaskedLM sees both sides while GPT with the same weights sees only the
past, decoder causality, the source reaches every target position, padding hides tokens,
``mask_tokens``' 80/10/10 statistics, and both models learn tasks that need what they add:
filling a gap from its right, and reversing a sequence.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
import torch.nn.functional as F

from course_lib import attention
from course_lib import model as M

TINY = M.ModelConfig(vocab_size=20, context_length=16, d_model=32, n_layers=2, n_heads=4)
VARIANTS = {
    "learned-pre": TINY,
    "rope-rms-gqa": dataclasses.replace(TINY, n_kv_heads=2, norm="rmsnorm", positional="rope", mlp="swiglu",
                                        tie_embeddings=False, bias=False),
    "sinusoidal-post-sdpa": dataclasses.replace(TINY, positional="sinusoidal", norm_position="post",
                                                attn_impl="sdpa"),
}


def _ids(B: int, S: int, V: int = 20, seed: int = 1, low: int = 0) -> torch.Tensor:
    return torch.randint(low, V, (B, S), generator=torch.Generator().manual_seed(seed))


def _randomise(module: torch.nn.Module, seed: int = 0) -> None:
    """Every weight random (std 0.2, not GPT-2's 0.02), norm gains around 1, so that attention
    is far from uniform and a swapped matrix or norm shows."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            is_gain = p.dim() == 1 and "norm" in name and name.endswith("weight")
            p.copy_((1.0 if is_gain else 0.0) + 0.2 * torch.randn(p.shape, generator=g))


def _masked_lm(config: M.ModelConfig, seed: int = 0) -> M.MaskedLM:
    model = M.MaskedLM(config).eval()
    _randomise(model, seed)
    return model


def _seq2seq(config: M.ModelConfig, seed: int = 0) -> M.EncoderDecoder:
    model = M.EncoderDecoder(config).eval()
    _randomise(model, seed)
    return model


def _changed_at(idx: torch.Tensor, pos: int, V: int = 20) -> torch.Tensor:
    out = idx.clone()
    out[:, pos] = (out[:, pos] + 1) % V
    return out


# --------------------------------------------------------------------------- MaskedLM
@pytest.mark.parametrize("name", VARIANTS)
def test_masked_lm_sees_later_tokens_and_gpt_with_the_same_weights_does_not(name):
    config = VARIANTS[name]
    mlm = _masked_lm(config)
    gpt = M.GPT(config).eval()
    # the same weights, so the only difference left is the mask
    state = {k.removeprefix("embed.").removeprefix("encoder."): v for k, v in mlm.state_dict().items()}
    gpt.load_state_dict(state)
    idx = _ids(2, 10)
    later = _changed_at(idx, 7)
    with torch.no_grad():
        a, _ = mlm(idx)
        b, _ = mlm(later)
        ga, _ = gpt(idx)
        gb, _ = gpt(later)
    assert (a[:, :7] - b[:, :7]).abs().amax(-1).min() > 1e-4  # every earlier position moved
    torch.testing.assert_close(ga[:, :7], gb[:, :7], atol=0, rtol=0)  # GPT's past is untouched
    assert (ga[:, 7:] - gb[:, 7:]).abs().amax() > 1e-4
    assert not torch.allclose(a, ga, atol=1e-4)  # the causal mask is the difference


@pytest.mark.parametrize("impl", ["naive", "sdpa"])
@pytest.mark.parametrize("name", VARIANTS)
def test_masked_lm_padding_mask_gives_each_row_the_logits_it_gets_alone(name, impl):
    config = dataclasses.replace(VARIANTS[name], attn_impl=impl)
    model = _masked_lm(config)
    lengths = torch.tensor([10, 6, 3])
    idx = _ids(3, 10)
    padding = attention.padding_mask(lengths, 10)[:, 0, 0]  # (B, 1, 1, S) -> (B, S), right padding
    other = torch.where(padding, idx, (idx + 7) % 20)  # only the pads change
    with torch.no_grad():
        got, _ = model(idx, padding_mask=padding)
        got_other, _ = model(other, padding_mask=padding)
        unmasked, _ = model(other)
        for b, n in enumerate(lengths.tolist()):
            alone, _ = model(idx[b:b + 1, :n])  # the reference: the real tokens without any padding
            torch.testing.assert_close(got[b, :n], alone[0], atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(got_other[b, :n], got[b, :n], atol=1e-6, rtol=0)
    assert (unmasked[1, :6] - got[1, :6]).abs().amax() > 1e-4  # without the mask the pads are seen


def test_masked_lm_loss_counts_only_targets_that_are_not_minus_100():
    model = _masked_lm(TINY)
    idx = _ids(2, 8)
    targets = torch.full_like(idx, -100)
    targets[0, 2], targets[1, 5] = 3, 11
    with torch.no_grad():
        logits, loss = model(idx, targets)
    want = -(logits.log_softmax(-1)[0, 2, 3] + logits.log_softmax(-1)[1, 5, 11]) / 2
    torch.testing.assert_close(loss, want)


def test_masked_lm_ties_its_head_to_the_token_embedding_when_asked():
    tied, untied = M.MaskedLM(TINY), M.MaskedLM(dataclasses.replace(TINY, tie_embeddings=False))
    assert tied.lm_head.weight is tied.embed.tok_emb.weight
    assert untied.lm_head.weight is not untied.embed.tok_emb.weight
    V, D = TINY.vocab_size, TINY.d_model
    assert sum(p.numel() for p in untied.parameters()) - sum(p.numel() for p in tied.parameters()) == V * D


# --------------------------------------------------------------------------- mask_tokens
def test_mask_tokens_follows_berts_80_10_10_rule():
    V, mask_id, p = 1000, 3, 0.15
    ids = _ids(200, 1000, V, low=4)  # 200k tokens, none of them [MASK]
    g = torch.Generator().manual_seed(0)
    inputs, targets = M.mask_tokens(ids, mask_id, p=p, vocab_size=V, generator=g)
    chosen = targets != -100
    assert abs(chosen.float().mean().item() - p) < 0.01
    assert torch.equal(targets[chosen], ids[chosen])
    assert torch.equal(inputs[~chosen], ids[~chosen])  # unchosen inputs are untouched
    masked = inputs[chosen] == mask_id
    kept = inputs[chosen] == ids[chosen]
    random = ~masked & ~kept
    # a random draw hits the original token 1 time in V: fold that into the expected fractions
    assert abs(masked.float().mean().item() - 0.8) < 0.02
    assert abs(kept.float().mean().item() - (0.1 + 0.1 / V)) < 0.02
    assert abs(random.float().mean().item() - 0.1 * (1 - 1 / V)) < 0.02
    replaced = inputs[chosen][random]
    assert replaced.min() >= 0 and replaced.max() < V and replaced.unique().numel() > V // 2  # spread out
    # a different generator state gives a different draw, the same one the same draw
    again = M.mask_tokens(ids, mask_id, p=p, vocab_size=V, generator=torch.Generator().manual_seed(0))
    other = M.mask_tokens(ids, mask_id, p=p, vocab_size=V, generator=torch.Generator().manual_seed(1))
    assert torch.equal(again[0], inputs) and torch.equal(again[1], targets)
    assert not torch.equal(other[1], targets)


def test_mask_tokens_with_p_1_chooses_everything():
    ids = _ids(4, 50, low=1)
    inputs, targets = M.mask_tokens(ids, 0, p=1.0, vocab_size=20, generator=torch.Generator().manual_seed(0))
    assert torch.equal(targets, ids)
    assert inputs.shape == ids.shape and inputs.dtype == torch.long


@pytest.mark.parametrize("kwargs, match", [
    (dict(p=0.0), "p must be in"),
    (dict(p=1.5), "p must be in"),
    (dict(p=-0.1), "p must be in"),
    (dict(mask_id=20), "mask_id must lie in"),
    (dict(mask_id=-1), "mask_id must lie in"),
    (dict(ids=torch.tensor([[1, 20]])), "ids must lie in"),
    (dict(ids=torch.tensor([[1.0, 2.0]])), "dtype torch.long"),
    (dict(ids=[[1, 2]]), "must be a tensor"),
])
def test_mask_tokens_rejects_bad_input(kwargs, match):
    args = dict(ids=_ids(2, 5), mask_id=0, p=0.15, vocab_size=20) | kwargs
    with pytest.raises(ValueError, match=match):
        M.mask_tokens(args.pop("ids"), args.pop("mask_id"), **args)


def test_masked_lm_learns_to_fill_a_gap_from_its_right():
    """Pairs ``a a b b c c ...`` of random tokens; the first of some pairs is masked. Nothing to
    its left says anything about it (entropy ln(n_tokens) for any left-to-right model); its
    right neighbour gives it away."""
    torch.manual_seed(0)
    pad_id, mask_id, low, V, S = 0, 1, 2, 20, 16
    model = M.MaskedLM(dataclasses.replace(TINY, vocab_size=V, context_length=S, n_layers=1)).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, betas=(0.9, 0.98))
    g = torch.Generator().manual_seed(0)

    def batch(B: int = 32):
        pairs = torch.randint(low, V, (B, S // 2), generator=g)
        ids = pairs.repeat_interleave(2, dim=1)  # (B, S): a a b b ...
        first = (torch.arange(S) % 2 == 0) & (torch.rand(B, S, generator=g) < 0.3)  # first of a pair only
        return torch.where(first, mask_id, ids), torch.where(first, ids, -100)

    for _ in range(150):
        inputs, targets = batch()
        _, loss = model(inputs, targets)
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    with torch.no_grad():
        inputs, targets = batch(256)
        logits, loss = model(inputs, targets)
    left_only = math.log(V - low)  # the best any model that reads only the left can do
    assert loss.item() < 0.1 * left_only, loss.item()
    chosen = targets != -100
    assert (logits.argmax(-1)[chosen] == targets[chosen]).float().mean() > 0.95
    assert pad_id not in inputs  # (no padding in this task)


# --------------------------------------------------------------------------- blocks vs torch
def _copy_mha(ours: attention.MultiHeadAttention, theirs: torch.nn.MultiheadAttention, bias: bool) -> None:
    theirs.in_proj_weight.copy_(torch.cat([ours.q_proj.weight, ours.k_proj.weight, ours.v_proj.weight]))
    theirs.out_proj.weight.copy_(ours.o_proj.weight)
    if bias:
        theirs.in_proj_bias.copy_(torch.cat([ours.q_proj.bias, ours.k_proj.bias, ours.v_proj.bias]))
        theirs.out_proj.bias.copy_(ours.o_proj.bias)


def _copy_mlp_and_norms(ours, theirs, norms: list[tuple]) -> None:
    theirs.linear1.weight.copy_(ours.mlp.up_proj.weight)
    theirs.linear1.bias.copy_(ours.mlp.up_proj.bias)
    theirs.linear2.weight.copy_(ours.mlp.down_proj.weight)
    theirs.linear2.bias.copy_(ours.mlp.down_proj.bias)
    for a, b in norms:
        b.weight.copy_(a.weight)
        b.bias.copy_(a.bias)


def _tanh_gelu(x: torch.Tensor) -> torch.Tensor:
    return F.gelu(x, approximate="tanh")


@pytest.mark.parametrize("impl", ["naive", "sdpa"])
@pytest.mark.parametrize("position", ["pre", "post"])
def test_decoder_block_matches_torch_transformer_decoder_layer(position, impl):
    config = dataclasses.replace(TINY, norm_position=position, attn_impl=impl)
    D, H = config.d_model, config.n_heads
    ours = M.DecoderBlock(config).eval()
    _randomise(ours)
    ref = torch.nn.TransformerDecoderLayer(D, H, dim_feedforward=config.ff_width, dropout=0.0,
                                           activation=_tanh_gelu, batch_first=True,
                                           norm_first=position == "pre").eval()
    with torch.no_grad():
        _copy_mha(ours.attn, ref.self_attn, bias=True)
        _copy_mha(ours.cross_attn, ref.multihead_attn, bias=True)
        _copy_mlp_and_norms(ours, ref, [(ours.attn_norm, ref.norm1), (ours.cross_norm, ref.norm2),
                                        (ours.mlp_norm, ref.norm3)])
    torch.manual_seed(1)
    St, Ss = 5, 7
    x, memory = torch.randn(3, St, D), torch.randn(3, Ss, D)
    src_padding = attention.padding_mask(torch.tensor([7, 4, 2]), Ss)[:, 0, 0]  # (B, Ss)
    causal = attention.causal_mask(St)
    with torch.no_grad():
        got = ours(x, memory, mask=causal, cross_mask=src_padding[:, None, None, :])
        want = ref(x, memory, tgt_mask=~causal, memory_key_padding_mask=~src_padding)  # torch: True = hide
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("position", ["pre", "post"])
def test_encoder_block_with_padding_matches_torch_transformer_encoder_layer(position):
    config = dataclasses.replace(TINY, norm_position=position)
    D, H = config.d_model, config.n_heads
    encoder = M.Encoder(dataclasses.replace(config, n_layers=1)).eval()
    _randomise(encoder)
    ours = encoder.blocks[0]
    ref = torch.nn.TransformerEncoderLayer(D, H, dim_feedforward=config.ff_width, dropout=0.0,
                                           activation=_tanh_gelu, batch_first=True,
                                           norm_first=position == "pre").eval()
    with torch.no_grad():
        _copy_mha(ours.attn, ref.self_attn, bias=True)
        _copy_mlp_and_norms(ours, ref, [(ours.attn_norm, ref.norm1), (ours.mlp_norm, ref.norm2)])
    torch.manual_seed(1)
    x = torch.randn(2, 6, D)
    padding = attention.padding_mask(torch.tensor([6, 4]), 6)[:, 0, 0]  # (B, S)
    with torch.no_grad():
        got = encoder(x, padding_mask=padding)
        want = ref(x, src_key_padding_mask=~padding)
        if position == "pre":  # the Encoder's final norm, as torch.nn.TransformerEncoder(norm=...) adds
            want = F.layer_norm(want, (D,), encoder.norm_f.weight, encoder.norm_f.bias, eps=1e-5)
    torch.testing.assert_close(got[padding], want[padding], atol=1e-5, rtol=1e-5)


# --------------------------------------------------------------------------- EncoderDecoder
@pytest.mark.parametrize("name", VARIANTS)
def test_encoder_decoder_is_causal_in_the_target_and_reads_all_of_the_source(name):
    model = _seq2seq(VARIANTS[name])
    src, tgt_in = _ids(2, 9, seed=1), _ids(2, 6, seed=2)
    with torch.no_grad():
        logits, _ = model(src, tgt_in)
        later, _ = model(src, _changed_at(tgt_in, 4))
        other_src, _ = model(_changed_at(src, 8), tgt_in)  # the *last* source token
        halves = model.decode(tgt_in, model.encode(src))
    torch.testing.assert_close(later[:, :4], logits[:, :4], atol=0, rtol=0)
    assert (later[:, 4:] - logits[:, 4:]).abs().amax() > 1e-4
    assert (other_src - logits).abs().amax(-1).min() > 1e-4  # every target position, the first included
    torch.testing.assert_close(halves, logits)


@pytest.mark.parametrize("name", VARIANTS)
def test_encoder_decoder_src_padding_mask_hides_padded_source_tokens(name):
    model = _seq2seq(VARIANTS[name])
    lengths = torch.tensor([9, 5])
    src, tgt_in = _ids(2, 9, seed=1), _ids(2, 6, seed=2)
    padding = attention.padding_mask(lengths, 9)[:, 0, 0]  # (B, Ss)
    other = torch.where(padding, src, (src + 5) % 20)
    with torch.no_grad():
        got, _ = model(src, tgt_in, src_padding_mask=padding)
        got_other, _ = model(other, tgt_in, src_padding_mask=padding)
        unmasked, _ = model(other, tgt_in)
        alone, _ = model(src[1:, :5], tgt_in[1:])  # the reference: the short source, unpadded
    torch.testing.assert_close(got_other, got, atol=1e-6, rtol=0)
    torch.testing.assert_close(got[1], alone[0], atol=1e-5, rtol=1e-5)
    assert (unmasked[1] - got[1]).abs().amax() > 1e-4


def test_encoder_decoder_shares_one_embedding_and_ties_the_head():
    model = M.EncoderDecoder(TINY)
    assert model.lm_head.weight is model.embed.tok_emb.weight
    names = [n for n, _ in model.named_parameters()]
    assert sum("tok_emb" in n for n in names) == 1  # one table reads the source and the target
    assert len(model.decoder) == len(model.encoder.blocks) == TINY.n_layers
    untied = M.EncoderDecoder(dataclasses.replace(TINY, tie_embeddings=False))
    assert untied.lm_head.weight is not untied.embed.tok_emb.weight


def _greedy(model: M.EncoderDecoder, src: torch.Tensor, bos: int, n: int) -> torch.Tensor:
    memory = model.encode(src)
    out = torch.full((src.shape[0], 1), bos)
    for _ in range(n):
        nxt = model.decode(out, memory)[:, -1].argmax(-1, keepdim=True)  # (B, 1)
        out = torch.cat([out, nxt], dim=1)
    return out[:, 1:]


def test_encoder_decoder_learns_to_reverse_a_sequence():
    torch.manual_seed(0)
    bos, low, V, S = 1, 2, 20, 5
    config = dataclasses.replace(TINY, vocab_size=V, context_length=S, n_layers=1)
    model = M.EncoderDecoder(config).train()
    opt = torch.optim.AdamW(model.parameters(), lr=5e-3, betas=(0.9, 0.98))  # Vaswani et al.'s betas
    g = torch.Generator().manual_seed(0)

    def batch(B: int = 64):
        src = torch.randint(low, V, (B, S), generator=g)
        tgt = src.flip(1)
        return src, torch.cat([torch.full((B, 1), bos), tgt[:, :-1]], dim=1), tgt  # teacher forcing

    for _ in range(150):
        src, tgt_in, tgt = batch()
        _, loss = model(src, tgt_in, tgt)
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    src, tgt_in, tgt = batch(256)
    with torch.no_grad():
        _, loss = model(src, tgt_in, tgt)
        out = _greedy(model, src, bos, S)
    assert loss.item() < 0.1 * math.log(V - low), loss.item()
    assert (out == tgt).all(-1).float().mean() > 0.9  # whole sequences right, decoded by the model alone


# --------------------------------------------------------------------------- bad input
def test_masked_lm_rejects_bad_input():
    model = _masked_lm(TINY)
    idx = _ids(2, 5)
    cases = [
        (lambda: model(idx.float()), "idx must be a \\(B, S\\) tensor of dtype torch.long"),
        (lambda: model(idx[0]), "idx must be a \\(B, S\\)"),
        (lambda: model(_ids(1, 17)), "more than context_length=16"),
        (lambda: model(idx + 20), "token ids must lie in 0 .. 19"),
        (lambda: model(idx, idx[:, :3]), "targets must have idx's shape"),
        (lambda: model(idx, padding_mask=torch.ones(2, 5)),
         "padding_mask must be a \\(B, Sk\\) = \\(2, 5\\) bool"),
        (lambda: model(idx, padding_mask=torch.ones(2, 4, dtype=torch.bool)), "padding_mask must be"),
        (lambda: model.encoder(idx), "x must be an embedded \\(B, S, D\\) tensor"),
    ]
    for call, match in cases:
        with pytest.raises(ValueError, match=match):
            call()


def test_encoder_decoder_rejects_bad_input():
    model = _seq2seq(TINY)
    src, tgt_in = _ids(2, 7), _ids(2, 5)
    memory = model.encode(src)
    cases = [
        (lambda: model(src, _ids(3, 5)), "same batch size B, got 2 and 3"),
        (lambda: model(src.int(), tgt_in), "src must be a \\(B, S\\) tensor of dtype torch.long"),
        (lambda: model(src, tgt_in[0]), "tgt_in must be a \\(B, S\\)"),
        (lambda: model(src, _ids(2, 17)), "tgt_in has 17 positions, more than context_length=16"),
        (lambda: model(src - 20, tgt_in), "src's token ids must lie in 0 .. 19"),
        (lambda: model(src, tgt_in, src), "targets must have tgt_in's shape \\(2, 5\\)"),
        (lambda: model(src, tgt_in, src_padding_mask=torch.ones(2, 5, dtype=torch.bool)),
         "src_padding_mask must be a \\(B, Sk\\) = \\(2, 7\\) bool"),
        (lambda: model(src, tgt_in, src_padding_mask=torch.ones(2, 7, dtype=torch.long)),
         "src_padding_mask must be"),
        (lambda: model.decode(tgt_in, memory[:1]), "memory must be \\(B=2, Ss, D=32\\)"),
        (lambda: model.decode(tgt_in, memory[..., :8]), "memory must be"),
        (lambda: model.decode(tgt_in, memory[0]), "memory must be"),
        (lambda: model.encode(src[None]), "src must be a \\(B, S\\)"),
    ]
    for call, match in cases:
        with pytest.raises(ValueError, match=match):
            call()
