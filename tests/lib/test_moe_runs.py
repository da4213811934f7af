"""Tests for course_lib.moe_runs, the chapter 07 training runs: a tiny end-to-end run that
resumes and reads back, and the shipped CSV against the configs it claims to come from."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest

from course_lib import flops, moe_runs
from tests.conftest import ROOT


def test_runs_train_end_to_end_resume_and_read_back(tmp_path):
    config = dataclasses.replace(moe_runs.TRAIN, max_steps=4, warmup_steps=1, eval_every=2, eval_batches=1,
                                 batch_size=4)
    out, kw = tmp_path / "moe_runs.csv", dict(config=config, max_chars=20_000, progress=False)
    rows = moe_runs.train_runs(out, ("dense", "top2-8"), seeds=(0,), **kw)
    assert [(r["name"], r["seed"]) for r in rows] == [("dense", 0), ("top2-8", 0)]
    rows = moe_runs.train_runs(out, ("dense", "top2-8"), seeds=(0, 1), **kw)  # resumes: only seed 1 is new
    assert [(r["name"], r["seed"]) for r in rows] == [("dense", 1), ("top2-8", 1)]
    back = moe_runs.read_runs(out)
    assert [r["seed"] for r in back["dense"]] == [0, 1]
    top2 = back["top2-8"][0]
    assert top2["active_params"] == flops.active_params(moe_runs.RUNS["top2-8"]) < top2["params"]
    assert [s for s, _ in top2["curve"]] == [0, 2, 4] and top2["curve"][-1][1] == top2["loss"]
    assert len(top2["load"]) == 2
    assert all(abs(sum(layer) - 1) < 1e-3 and len(layer) == 8 for layer in top2["load"])
    with pytest.raises(ValueError, match="unknown runs"):
        moe_runs.train_runs(out, ("switch-3",), config=config)


def test_the_shipped_runs_match_their_configs():
    shipped = moe_runs.read_runs()
    assert set(shipped) == set(moe_runs.RUNS)
    for name, rows in shipped.items():
        assert sorted(r["seed"] for r in rows) == list(moe_runs.SEEDS), name
        expected = flops.param_count(moe_runs.RUNS[name]).total, flops.active_params(moe_runs.RUNS[name])
        for row in rows:
            assert (row["params"], row["active_params"]) == expected, name
            assert row["curve"][-1] == (moe_runs.TRAIN.max_steps, row["loss"])
    # every top-1 MoE uses the dense model's parameters per token, plus its routers (L x D x E)
    dense = shipped["dense"][0]["params"]
    for rows in shipped.values():
        if rows[0]["top_k"] == 1 and rows[0]["n_experts"] > 1:
            assert rows[0]["active_params"] == dense + 2 * 32 * rows[0]["n_experts"]


def test_the_command_line_names_the_new_module():
    proc = subprocess.run([sys.executable, "-m", "course_lib.moe_runs", "--help"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "python -m course_lib.moe_runs" in proc.stdout and "train" in proc.stdout
