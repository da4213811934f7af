"""Tests for course_lib.pretrained.

The shipped checkpoint is small, rebuilds the spec's model and still has the validation loss
it claims (recomputed now, on the same held-out bytes and the same fixed batches); a three-step
build writes a file that loads back; an unknown name fails with a message naming the choices.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from course_lib import model as M
from course_lib import pretrained as P
from course_lib import train as T

TARGET = 1.6  # nats per byte on the validation split: what the shipped model must beat
SPEC = P.SHAKESPEARE_CHAR


def test_shipped_checkpoint_is_small_and_keeps_its_validation_loss():
    path = P.CHECKPOINT_DIR / "shakespeare_char.pt"
    assert path.is_file() and path.stat().st_size < 2_000_000
    info = P.load_info("shakespeare_char")
    assert M.ModelConfig(**info["model_config"]) == SPEC.model
    corpus = info["corpus"]
    assert (corpus["max_chars"], corpus["val_fraction"]) == (SPEC.max_chars, SPEC.val_fraction)
    assert info["steps"] == SPEC.train.max_steps
    model = P.load()
    assert isinstance(model, M.GPT) and model.config == SPEC.model and not model.training
    assert model.tok_emb.weight.dtype == torch.float32 and model.lm_head.weight is model.tok_emb.weight
    _, val_ids = SPEC.corpus()
    val_loss = T.evaluate(model, val_ids, SPEC.train)
    assert val_loss == pytest.approx(info["val_loss"], abs=0.05)
    assert val_loss < TARGET < math.log(256)


def test_a_short_build_runs_and_loads_back(tmp_path):
    # the recipe on 50,000 characters, with one more seed: build scores every validation byte twice
    # per seed (val_loss_all) and as many training bytes once, which on the whole corpus takes minutes
    small = dataclasses.replace(SPEC, max_chars=50_000, other_seeds=(1,))
    path = P.build(tmp_path / "sub" / "tiny.pt", max_steps=3, progress=False, spec=small)
    assert path == tmp_path / "sub" / "tiny.pt" and not (tmp_path / "sub" / "tiny.pt.tmp").exists()
    info = P.load_info(path)
    assert info["steps"] == 3 and info["train_config"]["max_steps"] == 3 and "state_dict" not in info
    assert math.isfinite(info["val_loss"]) and info["val_loss"] < math.log(256) + 0.5
    assert info["val_loss"] == pytest.approx(info["val_loss_fp32"], abs=1e-2)  # fp16 costs ~nothing
    _, val_ids = small.corpus()
    assert info["val_loss_all"] == pytest.approx(P.loss_all(P.load(path), val_ids), rel=1e-6)
    assert list(info["other_seeds"]) == [1] and math.isfinite(info["other_seeds"][1])
    assert info["other_seeds"][1] != info["val_loss_all"] and math.isfinite(info["train_loss_all"])
    model = P.load(path)
    assert model.config == SPEC.model and not model.training
    stored = torch.load(path, weights_only=True)["state_dict"]
    assert all(t.dtype == torch.float16 for t in stored.values() if t.is_floating_point())
    for name, t in model.state_dict().items():
        assert torch.equal(t, stored[name].float()), name


def test_unknown_checkpoint_fails_clearly():
    with pytest.raises(ValueError, match=r"unknown checkpoint 'nope'.*shakespeare_char"):
        P.load("nope")
    with pytest.raises(ValueError, match="unknown checkpoint"):
        P.load_info("nope")


def test_chapter03_checkpoint_is_the_chapters_model_on_the_chapters_split():
    spec = P.CHAPTER03_CHAR
    path = P.CHECKPOINT_DIR / "chapter03_char.pt"
    assert path.is_file() and path.stat().st_size < 2_000_000
    info = P.load_info("chapter03_char")
    assert M.ModelConfig(**info["model_config"]) == spec.model and info["steps"] == spec.train.max_steps
    assert (info["corpus"]["max_chars"], info["corpus"]["val_fraction"]) == (1_000_000, 0.1)
    model = P.load("chapter03_char")
    assert model.config == spec.model and not model.training
    _, val_ids = spec.corpus()
    assert T.evaluate(model, val_ids, spec.train) == pytest.approx(info["val_loss"], abs=0.05)
    # the recipe's other seeds, scored like the chapter scores the shipped model (val_loss_all)
    assert sorted(info["other_seeds"]) == sorted(spec.other_seeds) == [1, 2]
    losses = [info["val_loss_all"], *info["other_seeds"].values()]
    assert all(1.0 < x < 2.0 for x in losses) and max(losses) - min(losses) < 0.05
    head = val_ids[:20_000]  # a slice: the whole split takes the chapter's time, not the tests'
    assert P.loss_all(model, head) == pytest.approx(T.evaluate_all(model, head, stride=32), rel=1e-6)
