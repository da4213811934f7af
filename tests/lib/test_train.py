"""Tests for course_lib.train.

Hand formula for the schedule; training really lowers the loss on a text with an obvious
pattern; clipping checked from inside the optimizer (a step pre-hook sees the gradients that
AdamW is about to use); course_lib's AdamW trains exactly as torch's (the same loss history,
atol 0: on the CPU both run the same ops in the same order); resuming from a checkpoint equals
not stopping, bit for bit, with each optimizer; the checkpoint rebuilds the model; bad configs
name the bad field; the plot has two lines.
"""

from __future__ import annotations

import dataclasses
import math

import matplotlib

matplotlib.use("Agg")  # before pyplot is imported anywhere: no window, no display needed

import pytest  # noqa: E402
import torch  # noqa: E402
from torch.optim.optimizer import register_optimizer_step_pre_hook  # noqa: E402

from course_lib import data as D  # noqa: E402
from course_lib import model as M  # noqa: E402
from course_lib import optim  # noqa: E402
from course_lib import train as T  # noqa: E402

TINY = M.ModelConfig(vocab_size=256, context_length=16, d_model=32, n_layers=1, n_heads=2)
FAST = T.TrainConfig(max_steps=30, batch_size=8, lr=1e-2, min_lr=1e-3, warmup_steps=5, eval_every=10,
                     eval_batches=2, device="cpu", precision="fp32")


@pytest.fixture(scope="module")
def abc_ids():
    """'abcabc...' as bytes: after one token the next is certain, so a model can learn it fast."""
    return D.train_val_split(D.encode_corpus("abc" * 300))


def _model(config: M.ModelConfig = TINY, seed: int = 0) -> M.GPT:
    torch.manual_seed(seed)
    return M.GPT(config)


# --------------------------------------------------------------------------- schedule
def _hand_lr(step, lr, min_lr, W, T_):
    if step < W:
        return lr * step / W
    return min_lr + 0.5 * (lr - min_lr) * (1 + math.cos(math.pi * (step - W) / (T_ - W)))


@pytest.mark.parametrize("step", [0, 1, 10, 19, 20, 60, 100, 119, 120])
def test_lr_at_matches_the_hand_formula(step):
    c = T.TrainConfig(max_steps=120, warmup_steps=20, lr=3e-3, min_lr=3e-4)
    assert T.lr_at(step, c) == pytest.approx(_hand_lr(step, 3e-3, 3e-4, 20, 120), rel=1e-12, abs=1e-15)


def test_lr_at_key_points():
    c = T.TrainConfig(max_steps=120, warmup_steps=20, lr=3e-3, min_lr=3e-4)
    assert T.lr_at(0, c) == 0.0
    assert T.lr_at(20, c) == pytest.approx(3e-3)            # end of warm-up: the peak
    assert T.lr_at(70, c) == pytest.approx((3e-3 + 3e-4) / 2)  # half-way through the cosine
    assert T.lr_at(120, c) == pytest.approx(3e-4)           # the floor at max_steps
    assert T.lr_at(500, c) == pytest.approx(3e-4)           # and after it
    no_warmup = dataclasses.replace(c, warmup_steps=0)
    assert T.lr_at(0, no_warmup) == pytest.approx(3e-3)
    lrs = [T.lr_at(s, c) for s in range(121)]
    assert all(a < b for a, b in zip(lrs[:20], lrs[1:21], strict=True))       # rising during warm-up
    assert all(a >= b for a, b in zip(lrs[20:-1], lrs[21:], strict=True))       # never rising after


# --------------------------------------------------------------------------- config
@pytest.mark.parametrize("field, value", [
    ("max_steps", 0), ("batch_size", -1), ("lr", 0.0), ("min_lr", 1.0), ("warmup_steps", 10_000),
    ("weight_decay", -0.1), ("betas", (0.9, 1.0)), ("grad_clip", 0.0), ("eval_every", 0),
    ("eval_batches", 0), ("device", "tpu"), ("precision", "fp16"), ("checkpoint_every", 5),
    ("optimizer", "sgd"), ("muon_lr", 0.0),
])  # fmt: skip
def test_bad_config_names_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        T.TrainConfig(**{field: value})


def test_bad_optimizer_lists_the_choices():
    with pytest.raises(ValueError, match="'adamw', 'torch-adamw', 'muon'"):
        T.TrainConfig(optimizer="AdamW")


def test_config_is_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        T.TrainConfig().lr = 1.0  # type: ignore[misc]


# --------------------------------------------------------------------------- optimizer
def test_weight_decay_on_matrices_only():
    model = _model()
    opt = T.make_optimizer(model, T.TrainConfig(weight_decay=0.1))
    decay, no_decay = opt.param_groups
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    assert all(p.dim() == 2 for p in decay["params"]) and all(p.dim() == 1 for p in no_decay["params"])
    assert any(p is model.tok_emb.weight for p in decay["params"])          # tied embedding, once
    assert len(decay["params"]) + len(no_decay["params"]) == len(list(model.parameters()))


@pytest.mark.parametrize("name, cls", [("adamw", optim.AdamW), ("torch-adamw", torch.optim.AdamW),
                                       ("muon", optim.Muon)])
def test_make_optimizer_builds_the_named_one(name, cls):
    model = _model()
    config = T.TrainConfig(optimizer=name, weight_decay=0.1, lr=2e-3, muon_lr=0.04)
    opt = T.make_optimizer(model, config)
    assert type(opt) is cls
    groups = opt.param_groups
    assert sum(len(g["params"]) for g in groups) == len(list(model.parameters()))
    for g in groups:  # decay on matrices only, in every optimizer
        assert g["weight_decay"] == (0.1 if all(p.dim() >= 2 for p in g["params"]) else 0.0)
    if name == "muon":
        muon, *adamw = groups
        assert muon["use_muon"] and not any(g["use_muon"] for g in adamw)
        assert muon["params"] == optim.split_for_muon(model)[0] and muon["lr"] == 0.04
        T.set_lr(opt, 1e-3)  # the schedule at half the peak: Muon's lr at half its own peak
        assert muon["lr"] == pytest.approx(0.02) and all(g["lr"] == 1e-3 for g in adamw)


# --------------------------------------------------------------------------- training
def test_training_lowers_the_loss(abc_ids):
    train_ids, val_ids = abc_ids
    model = _model()
    before = T.evaluate(model, val_ids, FAST)
    history = T.train(model, train_ids, val_ids, FAST, progress=False)
    assert before == pytest.approx(math.log(256), abs=0.3)   # a fresh model guesses uniformly
    assert history.val_loss[0] == before                     # evaluation is deterministic
    assert history.val_steps == [0, 10, 20, 30]
    assert history.val_loss[-1] < 0.5 * before               # it learned the pattern
    assert T.evaluate(model, val_ids, FAST) == history.val_loss[-1]
    assert history.steps == list(range(30)) and len(history.train_loss) == len(history.lr) == 30
    assert history.lr == [T.lr_at(s, FAST) for s in range(30)]
    assert sum(history.train_loss[-5:]) < sum(history.train_loss[:5])
    assert all(b >= a for a, b in zip(history.seconds[:-1], history.seconds[1:], strict=True))
    assert model.training                                     # evaluate restored the mode


def test_our_adamw_trains_exactly_as_torchs(abc_ids):
    """20 steps with dropout and clipping: the same losses and weights, bit for bit."""
    train_ids, val_ids = abc_ids
    config = dataclasses.replace(TINY, dropout=0.1)
    tc = dataclasses.replace(FAST, max_steps=20, eval_every=5)
    ours, theirs = _model(config), _model(config)
    h_ours = T.train(ours, train_ids, val_ids, tc, progress=False)
    h_torch = T.train(theirs, train_ids, val_ids, dataclasses.replace(tc, optimizer="torch-adamw"),
                      progress=False)
    assert h_ours.train_loss == h_torch.train_loss and h_ours.val_loss == h_torch.val_loss
    for (name, a), b in zip(ours.state_dict().items(), theirs.state_dict().values(), strict=True):
        assert torch.equal(a, b), name


def test_muon_lowers_the_loss(abc_ids):
    train_ids, val_ids = abc_ids
    model = _model()
    history = T.train(model, train_ids, val_ids, dataclasses.replace(FAST, optimizer="muon"), progress=False)
    assert history.val_loss[-1] < 0.5 * history.val_loss[0]


def test_gradient_clipping_bounds_the_norm(abc_ids):
    """A global optimizer pre-step hook measures the gradient AdamW is about to apply."""
    train_ids, val_ids = abc_ids
    clip = 0.05
    norms: list[float] = []

    def record(optimizer, args, kwargs):
        grads = [p.grad for g in optimizer.param_groups for p in g["params"] if p.grad is not None]
        norms.append(torch.linalg.vector_norm(torch.stack([g.norm() for g in grads])).item())

    handle = register_optimizer_step_pre_hook(record)
    try:
        config = dataclasses.replace(FAST, max_steps=5, warmup_steps=2, grad_clip=clip)
        T.train(_model(), train_ids, val_ids, config, progress=False)
        clipped, norms[:] = list(norms), []
        T.train(_model(), train_ids, val_ids, dataclasses.replace(config, grad_clip=None), progress=False)
        unclipped = list(norms)
    finally:
        handle.remove()
    assert len(clipped) == len(unclipped) == 5
    assert max(unclipped) > clip                    # the bound matters for this model ...
    assert max(clipped) <= clip * (1 + 1e-5)        # ... and holds with clipping on
    assert clipped[0] == pytest.approx(clip, rel=1e-5)   # a large gradient is scaled to the bound


@pytest.mark.parametrize("optimizer", T.OPTIMIZERS)
def test_resume_gives_the_same_losses_as_not_stopping(abc_ids, tmp_path, optimizer):
    """20 steps straight vs 10, a fresh model object, resume, 10 more. Dropout is on, so the
    torch RNG state must be restored too; checkpoint_every=3 adds mid-run saves."""
    train_ids, val_ids = abc_ids
    config = dataclasses.replace(TINY, dropout=0.1)
    tc = dataclasses.replace(FAST, max_steps=20, eval_every=4, checkpoint_path=str(tmp_path / "a.pt"),
                             checkpoint_every=3, optimizer=optimizer)
    straight = _model(config)
    h_straight = T.train(straight, train_ids, val_ids, tc, progress=False)

    tc_b = dataclasses.replace(tc, checkpoint_path=str(tmp_path / "b.pt"))
    T.train(_model(config), train_ids, val_ids, tc_b, progress=False, stop_at=10)
    torch.manual_seed(123)  # whatever happens between the runs must not matter
    resumed = _model(config, seed=99)  # different initial weights: all must come from the checkpoint
    h_resumed = T.train(resumed, train_ids, val_ids, tc_b, resume=True, progress=False)

    assert h_resumed.steps == h_straight.steps == list(range(20))
    assert h_resumed.train_loss == h_straight.train_loss      # exact, atol 0
    assert h_resumed.val_steps == h_straight.val_steps == [0, 4, 8, 12, 16, 20]
    assert h_resumed.val_loss == h_straight.val_loss
    assert h_resumed.lr == h_straight.lr
    for (name, a), b in zip(straight.state_dict().items(), resumed.state_dict().values(), strict=True):
        assert torch.equal(a, b), name


def test_a_run_stopped_on_purpose_ends_its_progress_bar_full(abc_ids, monkeypatch):
    """A notebook trains in several cells with stop_at; each cell's bar must end full (a bar
    short of its total is drawn red in Jupyter, as if the run had failed)."""
    bars = []

    class Bar:
        def __init__(self, iterable, *, initial, total, desc, disable):
            self.iterable, self.n, self.total, self.desc = iterable, initial, total, desc
            bars.append(self)

        def __iter__(self):
            for item in self.iterable:
                yield item
                self.n += 1

        def set_postfix(self, **kwargs):
            pass

    monkeypatch.setattr(T, "tqdm", Bar)
    train_ids, val_ids = abc_ids
    tc = dataclasses.replace(FAST, max_steps=12, eval_every=4)
    model = _model()
    T.train(model, train_ids, val_ids, tc, stop_at=5)
    T.train(model, train_ids, val_ids, tc)  # the whole run, from the start
    assert [(b.n, b.total) for b in bars] == [(5, 5), (12, 12)]
    assert bars[0].desc == "train (to step 5 of 12)" and bars[1].desc == "train"


def test_resume_needs_a_checkpoint(abc_ids, tmp_path):
    train_ids, val_ids = abc_ids
    for path in (None, str(tmp_path / "missing.pt")):
        with pytest.raises(ValueError, match="checkpoint_path"):
            T.train(_model(), train_ids, val_ids, dataclasses.replace(FAST, checkpoint_path=path),
                    resume=True, progress=False)


def test_checkpoint_loads_and_rebuilds_the_model(abc_ids, tmp_path):
    train_ids, val_ids = abc_ids
    path = tmp_path / "sub" / "ckpt.pt"
    model = _model()
    tc = dataclasses.replace(FAST, max_steps=6, eval_every=3, checkpoint_path=str(path))
    history = T.train(model, train_ids, val_ids, tc, progress=False)
    ckpt = T.load_checkpoint(path)
    assert ckpt["step"] == 6 and ckpt["history"]["train_loss"] == history.train_loss
    assert set(ckpt) >= {"model", "optimizer", "batch_rng", "torch_rng"}
    rebuilt = M.GPT(M.ModelConfig(**ckpt["model_config"]))
    rebuilt.load_state_dict(ckpt["model"])
    assert T.evaluate(rebuilt, val_ids, tc) == history.val_loss[-1]
    assert not (tmp_path / "sub" / "ckpt.pt.tmp").exists()


def test_bf16_autocast_on_cpu_runs(abc_ids):
    """The opt-in CPU bf16 path trains and keeps fp32 weights (autocast, not a cast)."""
    train_ids, val_ids = abc_ids
    model = _model()
    tc = dataclasses.replace(FAST, max_steps=3, warmup_steps=1, eval_every=3, precision="bf16")
    history = T.train(model, train_ids, val_ids, tc, progress=False)
    assert all(math.isfinite(x) for x in history.train_loss + history.val_loss)
    assert model.tok_emb.weight.dtype == torch.float32


# --------------------------------------------------------------------------- plot
def test_plot_history_draws_train_and_val():
    import matplotlib.pyplot as plt

    history = T.History(steps=[0, 1, 2], train_loss=[3.0, 2.0, 1.5], lr=[0.0, 1.0, 1.0],
                        seconds=[0.1, 0.2, 0.3], val_steps=[0, 2], val_loss=[3.1, 1.6])
    ax = T.plot_history(history)
    assert isinstance(ax, matplotlib.axes.Axes) and len(ax.get_lines()) == 2
    assert list(ax.get_lines()[1].get_xdata()) == [0, 2]
    _, given = plt.subplots()
    assert T.plot_history(history, ax=given) is given
    plt.close("all")


def test_evaluate_all_scores_every_target_once():
    """evaluate_all is the mean of F.cross_entropy over every target ids[1:]: consecutive windows,
    then a last one that ends at the last target and counts only the targets not yet scored."""
    gpt = _model().eval()
    S = gpt.config.context_length
    ids = torch.randint(0, 256, (S * 5 + 8,), generator=torch.Generator().manual_seed(0))  # 87 targets
    with torch.no_grad():
        logits, _ = gpt(ids[:5 * S].view(5, S))  # targets 1 .. 80
        nll = torch.nn.functional.cross_entropy(logits.flatten(0, 1), ids[1:5 * S + 1], reduction="sum")
        last, _ = gpt(ids[-S - 1:-1][None])  # the window whose targets end at the last index, 87
        nll += torch.nn.functional.cross_entropy(last[0, -7:], ids[-7:], reduction="sum")  # targets 81 .. 87
    gpt.train()
    want = nll.item() / (len(ids) - 1)
    assert T.evaluate_all(gpt, ids, stride=S, batch_size=2) == pytest.approx(want, rel=1e-5)
    assert gpt.training  # the mode it had
    exact = ids[:3 * S + 1]  # whole windows only
    with torch.no_grad():
        logits, _ = gpt.eval()(exact[:-1].view(3, S))
        want = torch.nn.functional.cross_entropy(logits.flatten(0, 1), exact[1:])
    assert T.evaluate_all(gpt, exact, stride=S) == pytest.approx(want.item(), rel=1e-5)
    with pytest.raises(ValueError, match="at least context_length"):
        T.evaluate_all(gpt, ids[:S])
    for stride in (0, S + 1):
        with pytest.raises(ValueError, match="stride"):
            T.evaluate_all(gpt, ids, stride=stride)


def _sliding_reference(gpt, ids):
    """Each target ids[t] predicted by its own forward pass over the (up to) S tokens before it."""
    S, total = gpt.config.context_length, 0.0
    with torch.no_grad():
        for t in range(1, len(ids)):
            x = ids[max(0, t - S):t][None]  # (1, min(t, S))
            logits, _ = gpt(x)
            total += torch.nn.functional.cross_entropy(logits[0, -1:], ids[t:t + 1]).item()
    return total / (len(ids) - 1)


@pytest.mark.parametrize("stride", [1, 3])
def test_evaluate_all_with_a_sliding_window_gives_each_target_all_the_context_it_can_take(stride):
    """stride=1 is one forward pass per target over all the context the model takes (the
    reference, target by target); a stride s gives every target after the first window at least
    S - s + 1 tokens, exactly the reference's for the targets whose window is full."""
    gpt = _model().eval()
    S = gpt.config.context_length
    ids = torch.randint(0, 256, (2 * S + 5,), generator=torch.Generator().manual_seed(1))
    got = T.evaluate_all(gpt, ids, stride=stride, batch_size=3)
    if stride == 1:
        assert got == pytest.approx(_sliding_reference(gpt, ids), rel=1e-5)
    else:  # the windows ending at each scored target, rebuilt by hand
        starts = list(range(0, len(ids) - S, stride))
        starts += [len(ids) - 1 - S] if starts[-1] != len(ids) - 1 - S else []
        scored, total = 0, 0.0
        with torch.no_grad():
            for a in starts:
                logits, _ = gpt(ids[a:a + S][None])
                nll = torch.nn.functional.cross_entropy(logits[0], ids[a + 1:a + S + 1], reduction="none")
                fresh = [p for p in range(S) if a + p + 1 > scored]
                total += nll[fresh].sum().item()
                scored = a + S
        assert got == pytest.approx(total / (len(ids) - 1), rel=1e-5)


def test_loss_by_position_is_the_mean_loss_at_each_position_of_the_windows():
    gpt = _model().eval()
    S = gpt.config.context_length
    ids = torch.randint(0, 256, (4 * S + 3,), generator=torch.Generator().manual_seed(2))
    for stride in (None, 5):
        starts = list(range(0, len(ids) - S, stride or S))
        with torch.no_grad():
            logits, _ = gpt(torch.stack([ids[a:a + S] for a in starts]))  # (W, S, V)
            targets = torch.stack([ids[a + 1:a + S + 1] for a in starts])  # (W, S)
            nll = torch.nn.functional.cross_entropy(logits.transpose(1, 2), targets, reduction="none")
            want = nll.mean(0)
        got = T.loss_by_position(gpt, ids, stride=stride, batch_size=2)
        assert got.shape == (S,) and got.dtype == torch.float64
        torch.testing.assert_close(got, want.double(), rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="at least context_length"):
        T.loss_by_position(gpt, ids[:S])
