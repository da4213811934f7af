"""Tests for course_lib.optim.

* AdamW: oracle test against ``torch.optim.AdamW``, 20 steps on an MLP and a small GPT under
  several settings (weight decay 0 and 0.1, two groups with their own lr and decay, other
  betas and eps, lr rewritten every step by the schedule, parameters without a gradient), in
  float32 and float64. Both run the same per-tensor ops on the CPU, so the parameters and
  moments must be *equal* (atol 0) after every step; a state_dict round-trip resumes exactly.
* clip_grad_norm: equal to ``torch.nn.utils.clip_grad_norm_`` (returned norm and gradients).
* cosine_schedule: hand-worked values; ``train.lr_at`` is the same function of a config.
* newton_schulz: against the SVD: it keeps the singular vectors (U^T O V diagonal), maps each
  singular value by the scalar quintic iterated 5 times (a hand recurrence), lands in
  [0.5, 1.5] and points along U V^T (cosine > 0.9).
* Muon: a first step worked by hand; against a transcription of Jordan's public
  ``muon_update`` (fp32 instead of bf16) over 10 steps (atol 1e-6); its AdamW groups equal
  torch's AdamW; state_dict round-trip; the parameter split of a GPT.
"""

from __future__ import annotations

import copy
import io
import math

import pytest
import torch
from torch import nn

from course_lib import model as M
from course_lib import optim
from course_lib import train as T

TINY = M.ModelConfig(vocab_size=32, context_length=8, d_model=16, n_layers=2, n_heads=2)


def _mlp(seed=0, dtype=torch.float32):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 12), nn.GELU(), nn.LayerNorm(12), nn.Linear(12, 3)).to(dtype)


def _gpt(seed=0, dtype=torch.float32, config=TINY):
    torch.manual_seed(seed)
    return M.GPT(config).to(dtype)


def _loss(model, step):
    """A loss that depends on ``step`` (new batch every step), the same for both copies."""
    g = torch.Generator().manual_seed(1000 + step)
    dtype = next(model.parameters()).dtype
    if isinstance(model, M.GPT):
        idx = torch.randint(TINY.vocab_size, (3, TINY.context_length + 1), generator=g)
        return model(idx[:, :-1], idx[:, 1:])[1]
    x = torch.randn(5, 6, generator=g, dtype=torch.float64).to(dtype)
    y = torch.randint(3, (5,), generator=g)
    return nn.functional.cross_entropy(model(x), y)


def _groups(model, setting):
    params = list(model.parameters())
    if setting == "two_groups":  # as train.make_optimizer, plus a group lr of its own
        return [{"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.1},
                {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0, "lr": 3e-3}]
    return params


SETTINGS = {  # name -> (constructor kwargs, lr schedule or None)
    "wd0": (dict(lr=1e-2, weight_decay=0.0), None),
    "wd0.1": (dict(lr=1e-2, weight_decay=0.1), None),
    "two_groups": (dict(lr=1e-2, betas=(0.9, 0.95)), None),
    "betas_eps": (dict(lr=5e-3, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.05), None),
    "schedule": (dict(lr=1e-2, betas=(0.9, 0.95), weight_decay=0.1),
                 dict(lr=1e-2, min_lr=1e-3, warmup_steps=5, max_steps=20)),
}


def _step_both(models, optimizers, step, schedule, drop_grad=None):
    for model, opt in zip(models, optimizers, strict=True):
        if schedule is not None:
            T.set_lr(opt, optim.cosine_schedule(step, **schedule))
        opt.zero_grad(set_to_none=True)
        _loss(model, step).backward()
        if drop_grad is not None and step % 3 == 1:  # this parameter sat out: no gradient at all
            dict(model.named_parameters())[drop_grad].grad = None
        opt.step()


# --------------------------------------------------------------------------- AdamW
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("setting", list(SETTINGS))
@pytest.mark.parametrize("make_model", [_mlp, _gpt], ids=["mlp", "gpt"])
def test_adamw_equals_torch_step_by_step(make_model, setting, dtype):
    kwargs, schedule = SETTINGS[setting]
    ours_model, torch_model = make_model(dtype=dtype), make_model(dtype=dtype)
    ours = optim.AdamW(_groups(ours_model, setting), **kwargs)
    ref = torch.optim.AdamW(_groups(torch_model, setting), **kwargs)
    drop = next(iter(dict(ours_model.named_parameters())))  # the first parameter skips some steps
    for step in range(20):
        _step_both((ours_model, torch_model), (ours, ref), step, schedule, drop_grad=drop)
        for (name, p), q in zip(ours_model.named_parameters(), torch_model.parameters(), strict=True):
            assert torch.equal(p, q), f"{name} differs after step {step}"
    for p, q in zip(ours_model.parameters(), torch_model.parameters(), strict=True):
        s, r = ours.state[p], ref.state[q]
        assert s["step"] == r["step"].item()
        assert torch.equal(s["exp_avg"], r["exp_avg"]) and torch.equal(s["exp_avg_sq"], r["exp_avg_sq"])
    assert ours.state[dict(ours_model.named_parameters())[drop]]["step"] < 20   # skipped steps not counted


def _round_trip(optimizer_state: dict) -> dict:
    """Through bytes, as a checkpoint on disk: train.load_checkpoint uses weights_only=True."""
    buffer = io.BytesIO()
    torch.save(optimizer_state, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


@pytest.mark.parametrize("name", ["adamw", "muon"])
def test_state_dict_round_trip_resumes_exactly(name):
    """10 steps straight == 5 steps, save, a fresh optimizer on a copied model loads, 5 more."""
    def make(model):
        if name == "adamw":
            return optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
        matrices, others = optim.split_for_muon(model)
        return optim.Muon([{"params": matrices, "weight_decay": 0.1},
                           {"params": others, "use_muon": False, "lr": 1e-3}])

    straight = _gpt()
    opt = make(straight)
    for step in range(10):
        _step_both([straight], [opt], step, None)

    first = _gpt()
    opt = make(first)
    for step in range(5):
        _step_both([first], [opt], step, None)
    saved = _round_trip(opt.state_dict())
    resumed = copy.deepcopy(first)
    opt = make(resumed)
    opt.load_state_dict(saved)
    for step in range(5, 10):
        _step_both([resumed], [opt], step, None)
    for (key, p), q in zip(straight.named_parameters(), resumed.parameters(), strict=True):
        assert torch.equal(p, q), key


def test_adamw_resumes_from_torchs_state_dict():
    """torch keeps the step count as a tensor; a checkpoint written by torch's AdamW continues on
    ours exactly as on torch's."""
    ours_model, torch_model = _gpt(), _gpt()
    ref = torch.optim.AdamW(torch_model.parameters(), lr=1e-2)
    for step in range(3):
        _step_both([torch_model], [ref], step, None)
    ours_model.load_state_dict(torch_model.state_dict())
    ours = optim.AdamW(ours_model.parameters(), lr=1e-2)
    ours.load_state_dict(_round_trip(ref.state_dict()))
    for step in range(3, 6):
        _step_both((ours_model, torch_model), (ours, ref), step, None)
    for (name, p), q in zip(ours_model.named_parameters(), torch_model.parameters(), strict=True):
        assert torch.equal(p, q), name


@pytest.mark.parametrize("kwargs, match", [(dict(lr=-1.0), "lr"), (dict(eps=-1e-8), "eps"),
                                           (dict(weight_decay=-0.1), "weight_decay"),
                                           (dict(betas=(0.9, 1.0)), "betas")])
def test_bad_hyperparameters_are_named(kwargs, match):
    for cls in (optim.AdamW, optim.Muon):
        with pytest.raises(ValueError, match=match):
            cls([nn.Parameter(torch.zeros(2, 2))], **kwargs)


# --------------------------------------------------------------------------- clipping
def _params_with_grads(seed, scale, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    params = [nn.Parameter(torch.zeros(shape, dtype=dtype)) for shape in [(3, 4), (5,), (2, 2, 2), (7,)]]
    for p in params[:3]:  # the last one has no gradient and is skipped
        p.grad = scale * torch.randn(p.shape, generator=g, dtype=dtype)
    return params


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("scale, max_norm", [(10.0, 1.0), (0.01, 1.0), (1.0, 0.5), (1.0, 100.0)])
def test_clip_grad_norm_equals_torch(scale, max_norm, dtype):
    ours, ref = _params_with_grads(0, scale, dtype), _params_with_grads(0, scale, dtype)
    norm = optim.clip_grad_norm(ours, max_norm)
    ref_norm = torch.nn.utils.clip_grad_norm_(ref, max_norm)
    assert torch.equal(norm, ref_norm)
    for p, q in zip(ours, ref, strict=True):
        assert (p.grad is None) == (q.grad is None)
        assert p.grad is None or torch.equal(p.grad, q.grad)
    clipped_norm = math.sqrt(sum(p.grad.double().square().sum().item() for p in ours if p.grad is not None))
    assert clipped_norm == pytest.approx(min(norm.item(), max_norm), rel=1e-5)


def test_clip_grad_norm_edges():
    """A single tensor works like a list; no gradients at all gives 0 and changes nothing."""
    w = nn.Parameter(torch.zeros(2))
    w.grad = torch.tensor([3.0, 4.0])
    assert optim.clip_grad_norm(w, 1.0).item() == pytest.approx(5.0)
    assert w.grad.tolist() == pytest.approx([0.6, 0.8])
    assert optim.clip_grad_norm([nn.Parameter(torch.ones(3))], 1.0).item() == 0.0


# --------------------------------------------------------------------------- schedule
def test_cosine_schedule_hand_worked_values():
    """W = 4, T = 12, lr 1, min_lr 0.1: warm-up 0, 0.25, 0.5, 0.75; peak at W; half-way
    (step 8, p = 1/2) is the mean (1 + 0.1) / 2; at p = 1/4, cos(pi/4) = 0.7071 gives
    0.1 + 0.9 * (1 + 0.7071) / 2 = 0.8682; the floor from T on."""
    lr = dict(lr=1.0, min_lr=0.1, warmup_steps=4, max_steps=12)
    expected = {0: 0.0, 1: 0.25, 2: 0.5, 3: 0.75, 4: 1.0, 6: 0.1 + 0.9 * (1 + math.sqrt(0.5)) / 2,
                8: 0.55, 12: 0.1, 13: 0.1, 100: 0.1}
    for step, value in expected.items():
        assert optim.cosine_schedule(step, **lr) == pytest.approx(value, abs=1e-12), step
    doc = dict(lr=1.0, min_lr=0.0, warmup_steps=10, max_steps=110)   # train.lr_at's doctest
    assert [round(optim.cosine_schedule(s, **doc), 3) for s in (0, 5, 10, 60, 110, 200)] == [
        0.0, 0.5, 1.0, 0.5, 0.0, 0.0]
    assert optim.cosine_schedule(0, lr=1.0, min_lr=0.1, warmup_steps=0, max_steps=10) == 1.0  # no warm-up
    with pytest.raises(ValueError, match="warmup_steps"):
        optim.cosine_schedule(0, lr=1.0, min_lr=0.0, warmup_steps=11, max_steps=10)


def test_lr_at_is_cosine_schedule_of_the_config():
    c = T.TrainConfig(max_steps=50, warmup_steps=7, lr=3e-3, min_lr=2e-4)
    for step in range(60):
        assert T.lr_at(step, c) == optim.cosine_schedule(step, lr=3e-3, min_lr=2e-4, warmup_steps=7,
                                                         max_steps=50)


# --------------------------------------------------------------------------- Newton-Schulz
def _quintic(s: float, steps: int = 5) -> float:
    """The scalar map each singular value goes through: s -> a s + b s^3 + c s^5, 5 times."""
    a, b, c = 3.4445, -4.7750, 2.0315
    for _ in range(steps):
        s = a * s + b * s**3 + c * s**5
    return s


SHAPES = [(64, 16), (48, 32), (16, 64), (32, 48), (32, 32), (8, 8), (1, 16), (16, 1)]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_newton_schulz_orthogonalises(shape):
    G = torch.randn(shape, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    U, S, Vh = torch.linalg.svd(G, full_matrices=False)  # (rows, r), (r,), (r, cols)
    out = optim.newton_schulz(G)
    assert out.shape == G.shape and out.dtype == G.dtype
    inner = U.mT @ out @ Vh.mT  # (r, r): diagonal iff out has G's singular vectors
    torch.testing.assert_close(inner, torch.diag(inner.diagonal()), atol=1e-10, rtol=0)
    normalised = (S / S.square().sum().sqrt()).tolist()  # divided by ||G||_F
    expected = torch.tensor([_quintic(s) for s in normalised], dtype=torch.float64)
    torch.testing.assert_close(inner.diagonal(), expected, atol=1e-6, rtol=1e-6)
    assert 0.5 <= inner.diagonal().min() and inner.diagonal().max() <= 1.5
    ortho = U @ Vh
    assert (out * ortho).sum() / (out.norm() * ortho.norm()) > 0.9


def test_newton_schulz_is_scale_free_and_needs_a_matrix():
    G = torch.randn(12, 20, generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(optim.newton_schulz(1e3 * G), optim.newton_schulz(G), atol=1e-5, rtol=1e-5)
    assert optim.newton_schulz(G.bfloat16()).dtype == torch.bfloat16
    with pytest.raises(ValueError, match="matrix"):
        optim.newton_schulz(torch.ones(2, 3, 4))


# --------------------------------------------------------------------------- Muon
def _orthonormal(rows, cols, seed=0):
    """(rows, cols) with orthonormal columns if tall, rows if wide."""
    A = torch.randn(max(rows, cols), min(rows, cols), generator=torch.Generator().manual_seed(seed))
    Q = torch.linalg.qr(A).Q  # (max, min)
    return Q if rows >= cols else Q.mT


@pytest.mark.parametrize("shape", [(8, 2), (2, 8), (4, 4)])
@pytest.mark.parametrize("nesterov", [True, False])
def test_muon_first_step_by_hand(shape, nesterov):
    """g = 3 Q with Q orthonormal: all r = min(rows, cols) singular values equal, so after
    normalising each is 1 / sqrt(r), Newton-Schulz maps it to _quintic(1 / sqrt(r)) along Q
    (momentum only rescales g, which the normalising undoes), and the step is
    p1 = p0 (1 - lr wd) - lr sqrt(max(1, rows / cols)) _quintic(1 / sqrt(r)) Q."""
    rows, cols = shape
    Q = _orthonormal(rows, cols)
    p = nn.Parameter(torch.randn(shape, generator=torch.Generator().manual_seed(1)))
    p0 = p.detach().clone()
    p.grad = 3 * Q
    lr, wd = 0.02, 0.1
    optim.Muon([p], lr=lr, weight_decay=wd, nesterov=nesterov).step()
    s = _quintic(1 / math.sqrt(min(rows, cols)))
    expected = p0 * (1 - lr * wd) - lr * max(1, rows / cols) ** 0.5 * s * Q
    torch.testing.assert_close(p.detach(), expected, atol=1e-6, rtol=1e-6)


def _jordan_muon_step(p, grad, buf, lr, momentum, weight_decay, nesterov=True, ns_steps=5):
    """Keller Jordan's public muon_update + Muon.step (github.com/KellerJordan/Muon), transcribed
    with fp32 in place of bf16, as an independent oracle."""
    def zeropower_via_newtonschulz5(G, steps):
        a, b, c = (3.4445, -4.7750, 2.0315)
        X = G.clone()
        if G.size(-2) > G.size(-1):
            X = X.mT
        X = X / (X.norm(dim=(-2, -1), keepdim=True) + 1e-7)
        for _ in range(steps):
            A = X @ X.mT
            B = b * A + c * A @ A
            X = a * X + B @ X
        if G.size(-2) > G.size(-1):
            X = X.mT
        return X

    grad = grad.clone()  # Jordan's code overwrites the gradient with the Nesterov mix
    buf.lerp_(grad, 1 - momentum)
    update = grad.lerp_(buf, momentum) if nesterov else buf
    update = zeropower_via_newtonschulz5(update, steps=ns_steps)
    update *= max(1, grad.size(-2) / grad.size(-1)) ** 0.5
    p.mul_(1 - lr * weight_decay)
    p.add_(update.reshape(p.shape), alpha=-lr)


@pytest.mark.parametrize("shape", [(24, 8), (8, 24), (16, 16)])
@pytest.mark.parametrize("nesterov", [True, False])
def test_muon_matches_jordans_reference_over_steps(shape, nesterov):
    g = torch.Generator().manual_seed(2)
    p = nn.Parameter(torch.randn(shape, generator=g))
    ref, buf = p.detach().clone(), torch.zeros(shape)
    opt = optim.Muon([p], lr=0.05, momentum=0.9, weight_decay=0.01, nesterov=nesterov)
    for step in range(10):
        grad = torch.randn(shape, generator=g) + 0.1 * step  # a drifting mean: momentum matters
        p.grad = grad.clone()
        opt.step()
        _jordan_muon_step(ref, grad, buf, lr=0.05, momentum=0.9, weight_decay=0.01, nesterov=nesterov)
        torch.testing.assert_close(p.detach(), ref, atol=1e-6, rtol=1e-6, msg=f"step {step}")
        torch.testing.assert_close(opt.state[p]["momentum_buffer"], buf, atol=1e-6, rtol=1e-6)
        assert torch.equal(p.grad, grad)  # the gradient is not overwritten


def test_muon_gives_the_rest_the_adamw_update():
    """The use_muon=False groups of a GPT step exactly as torch.optim.AdamW with the same groups
    (the reference copy's matrices take Muon steps from a second optimizer, so that both copies
    see the same gradients)."""
    ours_model, ref_model = _gpt(), _gpt()
    hyper = [dict(lr=3e-3, betas=(0.9, 0.95), weight_decay=wd) for wd in (0.1, 0.0)]

    def groups(model):
        matrices, others = optim.split_for_muon(model)
        return matrices, [{"params": [p for p in others if p.dim() >= 2], **hyper[0]},
                          {"params": [p for p in others if p.dim() < 2], **hyper[1]}]

    matrices, adamw = groups(ours_model)
    ours = optim.Muon([{"params": matrices}] + [{**g, "use_muon": False} for g in adamw])
    ref_matrices, ref_adamw = groups(ref_model)
    refs = [optim.Muon([{"params": ref_matrices}]), torch.optim.AdamW(ref_adamw)]
    for step in range(5):
        for opt in (ours, *refs):
            opt.zero_grad(set_to_none=True)
        _loss(ours_model, step).backward()
        _loss(ref_model, step).backward()
        for opt in (ours, *refs):
            opt.step()
        for (name, p), q in zip(ours_model.named_parameters(), ref_model.parameters(), strict=True):
            assert torch.equal(p, q), f"{name} differs after step {step}"
    assert len(ours.state) == len(list(ours_model.parameters()))
    assert all("exp_avg" in ours.state[p] for g in adamw for p in g["params"])
    assert all("momentum_buffer" in ours.state[p] for p in matrices)


def test_split_for_muon_on_a_gpt():
    """Hidden Linear weights -> Muon; embeddings, the head (tied or not), biases, gains -> AdamW."""
    for tie in (True, False):
        model = _gpt(config=M.ModelConfig(**{**TINY.__dict__, "tie_embeddings": tie}))
        matrices, others = optim.split_for_muon(model)
        names = {id(p): n for n, p in model.named_parameters()}
        muon_names = sorted(names[id(p)] for p in matrices)
        expected = sorted(f"blocks.{i}.{part}.weight" for i in range(TINY.n_layers) for part in
                          ("attn.q_proj", "attn.k_proj", "attn.v_proj", "attn.o_proj", "mlp.up_proj",
                           "mlp.down_proj"))
        assert muon_names == expected
        assert all(p.dim() == 2 for p in matrices)
        assert len(matrices) + len(others) == len(list(model.parameters()))
        assert any(p is model.tok_emb.weight for p in others)
        assert any(p is model.lm_head.weight for p in others)


def test_muon_groups_take_matrices_only():
    with pytest.raises(ValueError, match="2-D"):
        optim.Muon([nn.Parameter(torch.zeros(3)), nn.Parameter(torch.zeros(2, 2))])
    with pytest.raises(ValueError, match="momentum"):
        optim.Muon([nn.Parameter(torch.zeros(2, 2))], momentum=1.0)
    with pytest.raises(ValueError, match="ns_steps"):
        optim.Muon([nn.Parameter(torch.zeros(2, 2))], ns_steps=0)
    opt = optim.Muon([{"params": [nn.Parameter(torch.zeros(3))], "use_muon": False}])  # AdamW: any shape
    assert opt.param_groups[0]["use_muon"] is False
