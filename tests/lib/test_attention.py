"""Tests for course_lib.attention.

References: torch's own ``scaled_dot_product_attention`` and ``nn.MultiheadAttention`` (with
weights copied across), literal masks worked by hand, the full forward pass (for every KV
cache), the quadratic form of linear attention, and algebra (Nadaraya-Watson = softmax
attention when keys share a norm). Gradients are compared with torch.autograd.
"""

from __future__ import annotations

import contextlib

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from course_lib import attention as A
from course_lib import positional as P

B, H, S, Dh = 2, 3, 7, 8


def _qkv(dtype=torch.float32, S=S, Sk=S, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, S, Dh, generator=g).to(dtype)
    k = torch.randn(B, H, Sk, Dh, generator=g).to(dtype)
    v = torch.randn(B, H, Sk, Dh, generator=g).to(dtype)
    return [t.requires_grad_() for t in (q, k, v)]


# --------------------------------------------------------------------------- masks
def test_masks_against_hand_written_examples():
    x, o = True, False
    assert torch.equal(A.causal_mask(3), torch.tensor([[x, o, o], [x, x, o], [x, x, x]]))
    assert torch.equal(A.causal_mask(2, 4), torch.tensor([[x, x, x, o], [x, x, x, x]]))
    assert torch.equal(A.sliding_window_mask(5, 2), torch.tensor([
        [x, o, o, o, o],
        [x, x, o, o, o],
        [o, x, x, o, o],
        [o, o, x, x, o],
        [o, o, o, x, x]]))
    # decoding step: query at position 4 (last of Sk = 5), window 3 -> keys 2, 3, 4
    assert torch.equal(A.sliding_window_mask(1, 3, 5), torch.tensor([[o, o, x, x, x]]))
    assert torch.equal(A.chunked_mask(5, 2), torch.tensor([
        [x, o, o, o, o],
        [x, x, o, o, o],
        [o, o, x, o, o],
        [o, o, x, x, o],
        [o, o, o, o, x]]))
    assert torch.equal(A.chunked_mask(5, 2, causal=False), torch.tensor([
        [x, x, o, o, o],
        [x, x, o, o, o],
        [o, o, x, x, o],
        [o, o, x, x, o],
        [o, o, o, o, x]]))
    # chunks are cut at absolute positions: queries 3, 4 of Sk = 5, chunk 2
    assert torch.equal(A.chunked_mask(2, 2, 5), torch.tensor([[o, o, x, x, o], [o, o, o, o, x]]))
    assert torch.equal(A.padding_mask(torch.tensor([1, 3, 0]), 3)[:, 0, 0],
                       torch.tensor([[x, o, o], [x, x, x], [o, o, o]]))
    assert A.padding_mask(torch.tensor([1, 3]), 3).shape == (2, 1, 1, 3)


def test_window_and_chunk_limits_match_causal():
    assert torch.equal(A.sliding_window_mask(6, 6), A.causal_mask(6))
    assert torch.equal(A.sliding_window_mask(6, 100), A.causal_mask(6))
    assert torch.equal(A.chunked_mask(6, 6), A.causal_mask(6))
    assert torch.equal(A.sliding_window_mask(4, 1), torch.eye(4, dtype=torch.bool))


def test_local_global_masks_and_combine():
    masks = A.local_global_masks(6, n_layers=6, window=2, global_every=3)
    kinds = ["global" if torch.equal(m, A.causal_mask(6)) else "local" for m in masks]
    assert kinds == ["local", "local", "global", "local", "local", "global"]
    assert all(torch.equal(masks[i], A.sliding_window_mask(6, 2)) for i in (0, 1, 3, 4))
    pad = A.padding_mask(torch.tensor([4, 6]), 6)
    combined = A.combine_masks(A.causal_mask(6), None, pad)
    assert combined.shape == (2, 1, 6, 6)
    assert torch.equal(combined, A.causal_mask(6) & pad)
    assert A.combine_masks(None, None) is None


# --------------------------------------------------------------------------- scaled dot-product
def _mask_cases():
    pad = A.padding_mask(torch.tensor([5, 7]), S)
    hole = A.causal_mask(S).clone()
    hole[2] = False  # a query that may attend to nothing
    return {
        "none": None,
        "causal": A.causal_mask(S),
        "window": A.sliding_window_mask(S, 3),
        "chunked": A.chunked_mask(S, 3),
        "chunked_bidir": A.chunked_mask(S, 3, causal=False),
        "padding": pad,
        "combined": A.combine_masks(A.sliding_window_mask(S, 4), pad),
        "local": A.local_global_masks(S, 2, 2, 2)[0],
        "global": A.local_global_masks(S, 2, 2, 2)[1],
        "fully_masked_row": hole,
        "per_head": torch.rand(B, H, S, S, generator=torch.Generator().manual_seed(1)) > 0.5,
    }


def _torch_reference(q, k, v, mask):
    """torch's SDPA, with fully masked rows zeroed by hand (done outside the op, so no NaN)."""
    if mask is None:
        return F.scaled_dot_product_attention(q, k, v)
    keep = mask.any(-1, keepdim=True)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask | ~keep) * keep


@pytest.mark.parametrize("dtype,atol", [(torch.float32, 1e-5), (torch.bfloat16, 3e-2)])
@pytest.mark.parametrize("name", list(_mask_cases()))
def test_naive_and_sdpa_agree_with_torch_values_and_gradients(name, dtype, atol):
    mask = _mask_cases()[name]
    grad_out = torch.randn(B, H, S, Dh, generator=torch.Generator().manual_seed(2)).to(dtype)
    results = {}
    for impl in ("naive", "sdpa", "torch"):
        q, k, v = _qkv(dtype)
        if impl == "torch":
            out = _torch_reference(q, k, v, mask)
        else:
            out = A.scaled_dot_product_attention(q, k, v, mask, impl=impl)
        out.backward(grad_out)
        results[impl] = [out, q.grad, k.grad, v.grad]
    for impl in ("naive", "sdpa"):
        for got, want in zip(results[impl], results["torch"], strict=True):
            assert got.dtype == dtype
            assert torch.isfinite(got).all()
            torch.testing.assert_close(got.float(), want.float(), atol=atol, rtol=atol)
    if name == "fully_masked_row":
        for impl in ("naive", "sdpa"):
            out, dq = results[impl][0], results[impl][1]
            assert (out[:, :, 2] == 0).all() and (dq[:, :, 2] == 0).all()


def test_is_causal_matches_the_causal_mask_and_torch_is_causal():
    q, k, v = _qkv()
    want = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    for impl in ("naive", "sdpa"):
        for kw in ({"mask": A.causal_mask(S)}, {"is_causal": True}):
            torch.testing.assert_close(A.scaled_dot_product_attention(q, k, v, impl=impl, **kw),
                                       want, atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="is_causal=True takes no mask"):
        A.scaled_dot_product_attention(q, k, v, A.causal_mask(S), is_causal=True)
    with pytest.raises(ValueError, match="S=3, Sk=5"):
        A.scaled_dot_product_attention(*_qkv(S=3, Sk=5), is_causal=True)


class _HostReads(TorchDispatchMode):
    """Records the operations that hand a tensor's value to Python (on a GPU, each waits for
    the device): .item(), bool(t), torch.equal, .tolist()."""

    SYNCING = {"_local_scalar_dense", "is_nonzero", "equal"}

    def __init__(self):
        super().__init__()
        self.seen = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func._schema.name.split("::")[-1] in self.SYNCING:
            self.seen.append(func._schema.name)
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("impl", ["naive", "sdpa"])
def test_attention_never_reads_a_value_on_the_host(impl, monkeypatch):
    """The GPT passes is_causal to attention instead of a mask, and attention finds fully masked
    rows on the device: no host synchronisation per attention call (there were two: a test for
    such rows with .any().all(), and torch.equal against a causal mask). The fused path gets
    is_causal itself, with no mask to read."""
    from course_lib.model import GPT, ModelConfig

    gpt = GPT(ModelConfig(vocab_size=32, context_length=16, d_model=16, n_heads=2, n_layers=2,
                          attn_impl=impl))
    idx = torch.randint(0, 32, (2, 16), generator=torch.Generator().manual_seed(0))
    reads, fused_calls = [], []
    forward, fused = A.MultiHeadAttention.forward, F.scaled_dot_product_attention

    def watched_forward(self, *args, **kwargs):
        with _HostReads() as mode:
            out = forward(self, *args, **kwargs)
        reads.extend(mode.seen)
        return out

    def watched_fused(*args, **kwargs):
        fused_calls.append((kwargs.get("attn_mask"), kwargs.get("is_causal")))
        return fused(*args, **kwargs)

    monkeypatch.setattr(A.MultiHeadAttention, "forward", watched_forward)
    monkeypatch.setattr(F, "scaled_dot_product_attention", watched_fused)
    gpt(idx)[0].sum().backward()
    assert reads == []
    assert fused_calls == ([(None, True)] * 2 if impl == "sdpa" else [])
    q, k, v = _qkv()
    mask = A.causal_mask(S).clone()
    mask[2] = False  # an explicit mask with a fully masked row: found on the device too
    with _HostReads() as mode:
        out = A.scaled_dot_product_attention(q, k, v, mask, impl=impl)
    assert mode.seen == [] and (out[:, :, 2] == 0).all()


def test_weights_rows_sum_to_one_and_respect_the_mask():
    q, k, v = _qkv(S=3, Sk=5)
    mask = A.causal_mask(3, 5)
    out, w = A.scaled_dot_product_attention(q, k, v, mask, return_weights=True)
    assert w.shape == (B, H, 3, 5) and out.shape == (B, H, 3, Dh)
    torch.testing.assert_close(w.sum(-1), torch.ones(B, H, 3))
    assert (w[..., ~mask] == 0).all()
    # softmax stable at large scores
    big = A.scaled_dot_product_attention(q * 100, k * 100, v)
    assert torch.isfinite(big).all()


def test_custom_scale_and_leading_dims():
    q, k, v = (torch.randn(5, 4, 6) for _ in range(3))  # one leading dim only
    want = torch.softmax(q @ k.transpose(-1, -2) * 0.3, -1) @ v
    for impl in ("naive", "sdpa"):
        torch.testing.assert_close(A.scaled_dot_product_attention(q, k, v, impl=impl, scale=0.3), want)


def test_repeat_kv_is_repeat_interleave():
    x = torch.randn(2, 3, 4, 5)
    for n in (1, 2, 4):
        assert torch.equal(A.repeat_kv(x, n), torch.repeat_interleave(x, n, dim=1))


# --------------------------------------------------------------------------- multi-head
def _torch_mha(mha: A.MultiHeadAttention, bias: bool) -> torch.nn.MultiheadAttention:
    D, kv_dim = mha.d_model, mha.kv_dim
    ref = torch.nn.MultiheadAttention(D, mha.n_heads, bias=bias, batch_first=True,
                                      kdim=kv_dim, vdim=kv_dim)
    with torch.no_grad():
        if ref._qkv_same_embed_dim:
            ref.in_proj_weight.copy_(torch.cat([mha.q_proj.weight, mha.k_proj.weight, mha.v_proj.weight]))
        else:
            ref.q_proj_weight.copy_(mha.q_proj.weight)
            ref.k_proj_weight.copy_(mha.k_proj.weight)
            ref.v_proj_weight.copy_(mha.v_proj.weight)
        ref.out_proj.weight.copy_(mha.o_proj.weight)
        if bias:
            ref.in_proj_bias.copy_(torch.cat([mha.q_proj.bias, mha.k_proj.bias, mha.v_proj.bias]))
            ref.out_proj.bias.copy_(mha.o_proj.bias)
    return ref


@pytest.mark.parametrize("impl", ["naive", "sdpa"])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("kind", ["self", "self_causal", "cross", "cross_kdim"])
def test_mha_matches_torch_multihead_attention(kind, bias, impl):
    torch.manual_seed(0)
    D, heads, S, Sk = 12, 3, 5, 6
    kv_dim = 10 if kind == "cross_kdim" else None
    mha = A.MultiHeadAttention(D, heads, bias=bias, impl=impl, kv_dim=kv_dim)
    if bias:
        for lin in (mha.q_proj, mha.k_proj, mha.v_proj, mha.o_proj):
            torch.nn.init.normal_(lin.bias)
    ref = _torch_mha(mha, bias)
    x = torch.randn(2, S, D)
    context = None if kind.startswith("self") else torch.randn(2, Sk, kv_dim or D)
    mask = A.causal_mask(S) if kind == "self_causal" else None
    kv = x if context is None else context
    want, want_w = ref(x, kv, kv, attn_mask=None if mask is None else ~mask,  # torch: True = NOT allowed
                       need_weights=True, average_attn_weights=False)
    got = mha(x, context, mask=mask)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    if impl == "naive":
        _, got_w = mha(x, context, mask=mask, return_weights=True)
        torch.testing.assert_close(got_w, want_w, atol=1e-5, rtol=1e-5)


def test_gqa_with_all_kv_heads_is_mha_and_gqa_is_mha_with_repeated_kv_weights():
    torch.manual_seed(0)
    D, heads, S = 16, 4, 6
    x, mask = torch.randn(2, S, D), A.causal_mask(S)
    mha = A.MultiHeadAttention(D, heads)
    same = A.MultiHeadAttention(D, heads, n_kv_heads=heads)
    same.load_state_dict(mha.state_dict())
    torch.testing.assert_close(same(x, mask=mask), mha(x, mask=mask))
    for n_kv in (2, 1):  # GQA and MQA
        gqa = A.MultiHeadAttention(D, heads, n_kv_heads=n_kv, bias=True)
        assert gqa.k_proj.weight.shape == (n_kv * gqa.head_dim, D)
        big = A.MultiHeadAttention(D, heads, bias=True)
        G = heads // n_kv
        with torch.no_grad():
            for name in ("q_proj", "o_proj"):
                getattr(big, name).load_state_dict(getattr(gqa, name).state_dict())
            for name in ("k_proj", "v_proj"):
                w = getattr(gqa, name).weight.view(n_kv, gqa.head_dim, D)  # (Hkv, Dh, D)
                getattr(big, name).weight.copy_(w.repeat_interleave(G, dim=0).reshape(D, D))
                b = getattr(gqa, name).bias.view(n_kv, gqa.head_dim)
                getattr(big, name).bias.copy_(b.repeat_interleave(G, dim=0).reshape(D))
        for impl in ("naive", "sdpa"):
            gqa.impl = impl
            torch.testing.assert_close(gqa(x, mask=mask), big(x, mask=mask), atol=1e-5, rtol=1e-5)


# --------------------------------------------------------------------------- KV caches
@pytest.mark.parametrize("n_kv", [4, 2, 1])  # MHA, GQA, MQA
@pytest.mark.parametrize("use_rotary", [False, True])
@pytest.mark.parametrize("impl", ["naive", "sdpa"])
def test_kv_cache_decoding_equals_full_causal_forward(n_kv, use_rotary, impl):
    torch.manual_seed(0)
    D, heads, T = 16, 4, 9
    mha = A.MultiHeadAttention(D, heads, n_kv_heads=n_kv, impl=impl).eval()
    rotary = P.RotaryEmbedding(D // heads) if use_rotary else None
    x = torch.randn(2, T, D)
    full = mha(x, mask=A.causal_mask(T), rotary=rotary)
    cache = A.KVCache(2, n_kv, D // heads, capacity=T)
    with torch.no_grad():
        prefill = mha(x[:, :3], cache=cache, rotary=rotary)  # 3 tokens at once: causal by default
        steps = [mha(x[:, t:t + 1], cache=cache, rotary=rotary) for t in range(3, T)]
    assert cache.length == T
    torch.testing.assert_close(torch.cat([prefill, *steps], dim=1), full, atol=1e-5, rtol=1e-5)
    cache.reset()
    assert cache.length == 0


@pytest.mark.parametrize("window", [1, 3, 4])
@pytest.mark.parametrize("use_rotary", [False, True])
def test_rolling_cache_equals_full_sliding_window_forward(window, use_rotary):
    torch.manual_seed(0)
    D, heads, n_kv, T = 16, 4, 2, 11
    mha = A.MultiHeadAttention(D, heads, n_kv_heads=n_kv).eval()
    rotary = P.RotaryEmbedding(D // heads) if use_rotary else None
    x = torch.randn(2, T, D)
    full = mha(x, mask=A.sliding_window_mask(T, window), rotary=rotary)
    cache = A.RollingKVCache(2, n_kv, D // heads, window=window)
    with torch.no_grad():
        prefill = mha(x[:, :5], cache=cache, rotary=rotary)  # longer than some windows
        steps = []
        for t in range(5, T):
            steps.append(mha(x[:, t:t + 1], cache=cache, rotary=rotary))
            assert cache.k.shape == (2, n_kv, window, D // heads)  # memory bounded by the window
    assert cache.length == T
    torch.testing.assert_close(torch.cat([prefill, *steps], dim=1), full, atol=1e-5, rtol=1e-5)


def test_rolling_cache_returns_the_last_window_in_order():
    cache = A.RollingKVCache(1, 1, 1, window=3)
    tok = [torch.full((1, 1, 1, 1), float(t)) for t in range(6)]
    seen = [cache.update(t, t)[0].flatten().tolist() for t in tok]
    assert seen == [[0.0], [0.0, 1.0], [0.0, 1.0, 2.0], [1.0, 2.0, 3.0], [2.0, 3.0, 4.0], [3.0, 4.0, 5.0]]
    k_all, _ = cache.update(torch.tensor([6.0, 7.0]).view(1, 1, 2, 1), torch.zeros(1, 1, 2, 1))
    assert k_all.flatten().tolist() == [4.0, 5.0, 6.0, 7.0]  # window - 1 past + 2 new
    assert cache.k.flatten().tolist() == [5.0, 6.0, 7.0]


def test_kv_cache_capacity_error_and_bytes():
    cache = A.KVCache(2, 3, 4, capacity=5, dtype=torch.float16)
    cache.update(torch.zeros(2, 3, 4, 4), torch.zeros(2, 3, 4, 4))
    with pytest.raises(ValueError, match=r"capacity 5 .* 7 positions"):
        cache.update(torch.zeros(2, 3, 3, 4), torch.zeros(2, 3, 3, 4))
    with pytest.raises(ValueError, match=r"Hkv=3"):
        cache.update(torch.zeros(2, 2, 1, 4), torch.zeros(2, 2, 1, 4))
    layers = 3
    real = sum(c.k.nbytes + c.v.nbytes for c in [A.KVCache(2, 3, 4, 5, dtype=torch.float16)] * layers)
    assert A.kv_cache_bytes(layers, 3, 4, 5, batch_size=2, bytes_per_element=2) == real
    # Llama-2-7B: 32 layers x 32 heads x 128 dims x 4096 tokens x 2 (k, v) x 2 bytes = 2 GiB
    assert A.kv_cache_bytes(32, 32, 128, 4096) == 2 * 2**30


# --------------------------------------------------------------------------- linear attention, kernels
@pytest.mark.parametrize("causal", [False, True])
def test_linear_attention_matches_quadratic_form(causal):
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 3, 10, 4), torch.randn(2, 3, 10, 4), torch.randn(2, 3, 10, 5)
    got = A.linear_attention(q, k, v, causal=causal)
    want = A.linear_attention_quadratic(q, k, v, causal=causal)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    assert got.shape == (2, 3, 10, 5)
    relu = lambda t: torch.relu(t) + 0.1  # noqa: E731
    torch.testing.assert_close(A.linear_attention(q, k, v, causal=causal, feature_map=relu),
                               A.linear_attention_quadratic(q, k, v, causal=causal, feature_map=relu),
                               atol=1e-5, rtol=1e-5)
    if causal:  # the first query sees only the first value
        torch.testing.assert_close(got[..., 0, :], v[..., 0, :], atol=1e-4, rtol=1e-4)


def test_nadaraya_watson_equals_softmax_attention_for_equal_norm_keys():
    torch.manual_seed(0)
    q = torch.randn(2, 5, 3)
    k = F.normalize(torch.randn(2, 7, 3), dim=-1) * 1.7  # all keys have norm 1.7
    v = torch.randn(2, 7, 4)
    for h in (0.5, 1.0, 2.0):
        out, w = A.nadaraya_watson(q, k, v, bandwidth=h, return_weights=True)
        want_out, want_w = A.scaled_dot_product_attention(q, k, v, scale=1 / h**2, return_weights=True)
        torch.testing.assert_close(w, want_w, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(out, want_out, atol=1e-5, rtol=1e-5)
    # by hand: one query halfway between two keys gets their mean
    keys, values = torch.tensor([[-2.0], [2.0]]), torch.tensor([[1.0], [3.0]])
    assert A.nadaraya_watson(torch.zeros(1, 1), keys, values) == 2


# --------------------------------------------------------------------------- errors
def test_errors_name_the_bad_value():
    q, k, v = _qkv()
    with pytest.raises(ValueError, match="impl must be one of"):
        A.scaled_dot_product_attention(q, k, v, impl="flash")
    with pytest.raises(ValueError, match="return_weights=True needs impl='naive'"):
        A.scaled_dot_product_attention(q, k, v, impl="sdpa", return_weights=True)
    with pytest.raises(ValueError, match=r"mask of shape \(4, 4\)"):
        A.scaled_dot_product_attention(q, k, v, A.causal_mask(4))
    with pytest.raises(ValueError, match="must be bool"):
        A.scaled_dot_product_attention(q, k, v, torch.zeros(S, S))
    with pytest.raises(ValueError, match="same rank"):
        A.scaled_dot_product_attention(q, k[0], v)
    with pytest.raises(ValueError, match="window must be >= 1"):
        A.sliding_window_mask(4, 0)
    with pytest.raises(ValueError, match="chunk must be >= 1"):
        A.chunked_mask(4, 0)
    with pytest.raises(ValueError, match="S=5, Sk=3"):
        A.causal_mask(5, 3)
    with pytest.raises(ValueError, match=r"lengths must lie in 0 .. Sk=3"):
        A.padding_mask(torch.tensor([4]), 3)
    with pytest.raises(ValueError, match="d_model=10 is not divisible by n_heads=4"):
        A.MultiHeadAttention(10, 4)
    with pytest.raises(ValueError, match="n_heads=4 is not divisible by n_kv_heads=3"):
        A.MultiHeadAttention(16, 4, n_kv_heads=3)
    mha = A.MultiHeadAttention(16, 4)
    with pytest.raises(ValueError, match=r"x must be \(B, S, D=16\), got shape \(3, 16\)"):
        mha(torch.randn(3, 16))
    with pytest.raises(ValueError, match=r"got shape \(1, 3, 8\)"):
        mha(torch.randn(1, 3, 8))
    with pytest.raises(ValueError, match=r"context must be \(B=1, Sk, kv_dim=16\)"):
        mha(torch.randn(1, 3, 16), torch.randn(1, 3, 8))
    with pytest.raises(ValueError, match=r"mask of shape \(4, 4\) does not broadcast to \(B, H, S, Sk\)"):
        mha(torch.randn(1, 3, 16), mask=A.causal_mask(4))
    with pytest.raises(ValueError, match="cache and rotary are for self-attention"):
        mha(torch.randn(1, 3, 16), torch.randn(1, 3, 16), cache=A.KVCache(1, 4, 4, 8))
    with pytest.raises(ValueError, match="causal linear attention needs S == Sk"):
        A.linear_attention(q, k[..., :3, :], v[..., :3, :], causal=True)
    with pytest.raises(ValueError, match="bandwidth must be > 0"):
        A.nadaraya_watson(q, k, v, bandwidth=0)
    with pytest.raises(ValueError, match="n_rep must be >= 1"):
        A.repeat_kv(k, 0)


# --------------------------------------------------------------------------- tiled attention (online softmax)
def _sdpa_reference(q, k, v, causal):
    """torch's fused attention; causal here means the queries are the last S of Sk positions."""
    S, Sk = q.shape[-2], k.shape[-2]
    if not causal:
        return F.scaled_dot_product_attention(q, k, v)
    if S == Sk:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=A.causal_mask(S, Sk))


@pytest.mark.parametrize("dtype, tol", [(torch.float64, 1e-12), (torch.float32, 2e-6)])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape, block", [
    ((2, 3, 7, 7, 8, 8), 3),      # B, H, S, Sk, Dh, Dv: block does not divide Sk
    ((2, 3, 8, 8, 8, 8), 4),      # block divides Sk
    ((1, 2, 5, 13, 16, 4), 5),    # S < Sk (queries at the end), Dv != Dh, a last block of 3
    ((1, 1, 6, 6, 4, 4), 1),      # one key per block
    ((2, 1, 9, 9, 8, 8), 64),     # one block holds every key
    ((1, 2, 1, 11, 8, 8), 4),     # a single query (a decoding step)
])
def test_tiled_attention_matches_torch_sdpa(shape, block, causal, dtype, tol):
    B_, H_, S_, Sk_, Dh_, Dv_ = shape
    g = torch.Generator().manual_seed(sum(shape) + block)
    q = torch.randn(B_, H_, S_, Dh_, generator=g, dtype=torch.float64).to(dtype)
    k = torch.randn(B_, H_, Sk_, Dh_, generator=g, dtype=torch.float64).to(dtype)
    v = torch.randn(B_, H_, Sk_, Dv_, generator=g, dtype=torch.float64).to(dtype)
    got = A.tiled_attention(q, k, v, block=block, causal=causal)
    assert got.dtype == dtype and got.shape == (B_, H_, S_, Dv_)
    want = _sdpa_reference(q.double(), k.double(), v.double(), causal)
    torch.testing.assert_close(got.double(), want, atol=tol, rtol=tol)
    torch.testing.assert_close(got, _sdpa_reference(q, k, v, causal), atol=10 * tol, rtol=10 * tol)


def test_tiled_attention_gradients_match_sdpa():
    q, k, v = _qkv(torch.float64, S=5, Sk=11)
    got = A.tiled_attention(q, k, v, block=4, causal=True)
    want = _sdpa_reference(q, k, v, causal=True)
    w = torch.randn(got.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    g_got = torch.autograd.grad((got * w).sum(), (q, k, v))
    g_want = torch.autograd.grad((want * w).sum(), (q, k, v))
    for a, b in zip(g_got, g_want, strict=True):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=1e-12)


def _masked_reference(q, k, v, mask):
    """softmax(q k^T / sqrt(Dh), masked) v in q's dtype, a row with no allowed key giving zeros."""
    scores = (q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5).masked_fill(~mask, float("-inf"))
    return torch.softmax(scores, dim=-1).nan_to_num(0.0) @ v  # (..., S, Sk) @ (..., Sk, Dv)


def test_tiled_attention_with_a_mask_and_a_fully_masked_row():
    q, k, v = (t.detach() for t in _qkv(torch.float64, S=4, Sk=10))
    mask = torch.rand(B, H, 4, 10, generator=torch.Generator().manual_seed(2)) > 0.4  # (B, H, S, Sk)
    mask[0, 1, 2] = False  # query 2 of head 1 in sequence 0 sees nothing
    mask[1, 0, 0] = False
    mask[1, 0, 0, 9] = True  # only the last key, in the last (short) block
    got = A.tiled_attention(q, k, v, mask, block=3)
    want = _masked_reference(q, k, v, mask)
    torch.testing.assert_close(got, want, atol=1e-12, rtol=1e-12)
    assert torch.equal(got[0, 1, 2], torch.zeros(Dh, dtype=torch.float64))
    torch.testing.assert_close(got[1, 0, 0], v[1, 0, 9])
    # a padding mask (B, 1, 1, Sk) combined with causal, and blocks processed after a masked one
    pad = A.padding_mask(torch.tensor([7, 10]), 10)  # (B, 1, 1, Sk): keys 7.. of sequence 0 are padding
    got = A.tiled_attention(q, k, v, pad, block=4, causal=True)
    want = _masked_reference(q, k, v, pad & A.causal_mask(4, 10))
    torch.testing.assert_close(got, want, atol=1e-12, rtol=1e-12)


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_tiled_attention_is_stable_for_scores_far_from_zero(sign):
    """Scores of +-100 to +-700 in float32 (exp overflows above 88 and underflows below -103):
    the running max must move with every block and start at -inf, not 0."""
    q = torch.tensor([[sign * 2.0, 0.0, 0.0, 0.0]])  # Dh = 4, scale 1/2: score_j = sign * k_j[0]
    k = torch.zeros(14, 4)
    k[:, 0] = torch.tensor([100, 101, 102, 200, 201, 202, 300, 301, 302, 400, 401, 402, 700, 701.0])
    v = torch.randn(14, 3, generator=torch.Generator().manual_seed(3))
    got = A.tiled_attention(q, k, v, block=3)
    want = torch.softmax(sign * k[:, :1].double().T, dim=-1) @ v.double()  # (1, Sk) @ (Sk, 3)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got.double(), want, atol=1e-6, rtol=1e-6)


def test_tiled_attention_broadcasts_and_keeps_low_precision_dtypes():
    q, k, v = (t.detach() for t in _qkv(S=6, Sk=9))
    k1, v1 = k[:, :1], v[:, :1]  # (B, 1, Sk, Dh): one kv head shared by all query heads (MQA)
    torch.testing.assert_close(A.tiled_attention(q, k1, v1, block=4),
                               F.scaled_dot_product_attention(q, k1.expand_as(k), v1.expand_as(v)))
    torch.testing.assert_close(A.tiled_attention(q[0, 0], k[0, 0], v[0, 0], block=2, causal=True),
                               F.scaled_dot_product_attention(q[0, 0], k[0, 0], v[0, 0],
                                                              attn_mask=A.causal_mask(6, 9)))
    out = A.tiled_attention(q.bfloat16(), k.bfloat16(), v.bfloat16(), block=4)  # computed in fp32
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), F.scaled_dot_product_attention(q, k, v), atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(A.tiled_attention(q, k, v, block=4, scale=0.3),
                               F.scaled_dot_product_attention(q, k, v, scale=0.3))


def test_tiled_attention_never_holds_the_score_matrix():
    S_, Sk_, block = 256, 512, 32
    q, k, v = torch.randn(1, 2, S_, 16), torch.randn(1, 2, Sk_, 16), torch.randn(1, 2, Sk_, 16)
    with torch.no_grad(), A.watch_tensors() as tiled:
        A.tiled_attention(q, k, v, block=block, causal=True)
    with torch.no_grad(), A.watch_tensors() as naive:
        A.scaled_dot_product_attention(q, k, v, A.causal_mask(S_, Sk_))
    assert naive.largest >= 2 * S_ * Sk_  # the (B, H, S, Sk) scores
    assert tiled.largest <= 2 * S_ * max(block, 16)  # a block of scores or the (B, H, S, Dv) output
    assert tiled.peak_bytes < naive.peak_bytes / 4
    assert "aten.bmm" in naive.ops and not any("scaled_dot_product" in op for op in tiled.ops)


@pytest.mark.parametrize("how", ["mask", "is_causal", "none", "grad"])
def test_naive_attention_holds_at_most_two_score_sized_tensors(how):
    """The scores and the weights the softmax writes from them (chapter 02 quotes the peak): a
    score matrix scaled through q, masked in place and freed once the weights exist."""
    S_, Sk_ = 64, 96
    q, k, v = torch.randn(1, 2, S_, 8), torch.randn(1, 2, Sk_, 8), torch.randn(1, 2, Sk_, 8)
    kwargs = {"mask": A.causal_mask(S_, Sk_)} if how in ("mask", "grad") else {}
    if how == "is_causal":
        k, v, Sk_ = k[..., :S_, :], v[..., :S_, :], S_
        kwargs = {"is_causal": True}
    q.requires_grad_(how == "grad")
    with torch.no_grad() if how != "grad" else contextlib.nullcontext(), A.watch_tensors() as w:
        out = A.scaled_dot_product_attention(q, k, v, **kwargs)
    square = [shape for _, shape, _ in w.at_peak if shape[-2:] == (S_, Sk_) and len(shape) == 4]
    assert len(square) <= 2, w.at_peak
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=kwargs.get("mask"), is_causal=how == "is_causal")
    torch.testing.assert_close(out, want)
    if how == "grad":
        out.sum().backward()  # masking in place does not break the backward pass
        assert q.grad is not None and torch.isfinite(q.grad).all()


def test_watch_tensors_counts_new_tensors_alive_at_once():
    x = torch.ones(100)  # made before: not counted
    with A.watch_tensors() as w:
        a = x * 2  # 400 bytes
        b = a[10:]  # a view: no new memory
        a.add_(1)  # in place: no new memory
        c = torch.cat([a, b])  # 760 bytes more -> 1,160
        del a, b, c
        d = torch.zeros(250)  # 1,000 bytes, after the others were freed
    assert (w.largest, w.peak_bytes) == (250, 1160)
    assert {"aten.mul", "aten.cat", "aten.add_"} <= w.ops
    del d


def test_tiled_attention_errors_name_the_bad_value():
    q, k, v = _qkv()
    with pytest.raises(ValueError, match="block must be >= 1, got 0"):
        A.tiled_attention(q, k, v, block=0)
    with pytest.raises(ValueError, match="causal attention needs Sk >= S.*S=7, Sk=3"):
        A.tiled_attention(q, k[..., :3, :], v[..., :3, :], causal=True)
    with pytest.raises(ValueError, match="must be bool"):
        A.tiled_attention(q, k, v, torch.zeros(S, S))


@pytest.mark.parametrize("shapes", [
    [(2, 1, 4), (3, 1), ()], [(1,), (5,)], [(0, 3), (1, 3)], [(2, 3, 4, 5)], [(1, 1, 7, 7), (2, 4, 7, 7)],
    [(3,), (4,)], [(2, 3), (3, 2)], [(0,), (3,)], [(2, 1, 4), (1, 3, 5)],
])
def test_broadcast_shape_follows_torch(shapes):
    try:
        want = tuple(torch.broadcast_shapes(*shapes))
    except RuntimeError:
        with pytest.raises(ValueError, match="do not broadcast"):
            A.core.broadcast_shape(*shapes)
        return
    assert A.core.broadcast_shape(*shapes) == want


def test_the_watch_sees_a_fused_kernel_even_with_torch_modes_switched_off():
    """A dispatch mode can be taken off torch's stack by the code it watches; the watch's profile
    hook still sees the fused function called."""
    from torch.utils._python_dispatch import _disable_current_modes

    q = torch.randn(1, 1, 4, 8)
    with A.watch_tensors() as w:
        with _disable_current_modes():
            F.scaled_dot_product_attention(q, q, q)
    assert any("scaled_dot_product" in op for op in w.ops), w.ops
