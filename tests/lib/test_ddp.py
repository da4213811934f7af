"""Tests for data-parallel training in course_lib.train (torch.distributed, DDP).

Two CPU processes (gloo, rendezvous through a file, so no TCP port can clash) train a tiny GPT
for a few steps; one process trains the same model on the same global batches. The ranks end
with equal weights (rank 1 even starts from other weights: DDP copies rank 0's), those weights
equal the single process's, and so do the train and validation losses. Both ranks also reject
a batch that does not split into two equal shares. The processes are spawned once per module.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from course_lib import model as M
from course_lib import train as T

WORLD = 2
TINY = M.ModelConfig(vocab_size=64, context_length=16, d_model=32, n_layers=2, n_heads=4)
CONFIG = T.TrainConfig(max_steps=5, batch_size=8, lr=1e-3, min_lr=1e-4, warmup_steps=1, eval_every=2,
                       eval_batches=2, device="cpu", precision="fp32")


def _corpus() -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.randint(0, TINY.vocab_size, (2000,), generator=torch.Generator().manual_seed(0))
    return ids[:1800], ids[1800:]


def _model(seed: int) -> M.GPT:
    torch.manual_seed(seed)
    return M.GPT(TINY)


def _worker(rank: int, init_file: str, out_dir: str) -> None:
    """One rank: the indivisible batch first (must fail before any communication), then training."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD)
    try:
        train_ids, val_ids = _corpus()
        error = ""
        try:
            T.train(_model(rank), train_ids, val_ids, dataclasses.replace(CONFIG, batch_size=7),
                    progress=False)
        except ValueError as e:
            error = str(e)
        model = _model(rank)  # rank 1 starts from other weights: DDP must copy rank 0's
        history = T.train(model, train_ids, val_ids, CONFIG, progress=False)
        torch.save({"state": model.state_dict(), "history": dataclasses.asdict(history), "error": error},
                   f"{out_dir}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """(rank 0's result, rank 1's result, the single process's model and history)."""
    tmp = tmp_path_factory.mktemp("ddp")
    mp.spawn(_worker, args=(str(tmp / "rendezvous"), str(tmp)), nprocs=WORLD, join=True)
    ranks = [torch.load(tmp / f"rank{r}.pt", weights_only=True) for r in range(WORLD)]
    single = _model(0)
    history = T.train(single, *_corpus(), CONFIG, progress=False)
    return ranks[0], ranks[1], single, history


def test_ranks_stay_in_sync(runs):
    rank0, rank1, _, _ = runs
    for name, a in rank0["state"].items():
        assert torch.equal(a, rank1["state"][name]), name
    assert rank0["history"]["train_loss"] == rank1["history"]["train_loss"]
    assert rank0["history"]["val_loss"] == rank1["history"]["val_loss"]


def test_two_processes_match_one_on_the_global_batch(runs):
    rank0, _, single, history = runs
    assert not torch.equal(single.tok_emb.weight, _model(0).tok_emb.weight)  # it did train
    for name, a in single.state_dict().items():
        torch.testing.assert_close(rank0["state"][name], a, atol=1e-5, rtol=1e-4, msg=name)
    assert rank0["history"]["steps"] == history.steps == list(range(5))
    assert rank0["history"]["train_loss"] == pytest.approx(history.train_loss, abs=1e-5)
    assert rank0["history"]["val_steps"] == history.val_steps == [0, 2, 4, 5]
    assert rank0["history"]["val_loss"] == pytest.approx(history.val_loss, abs=1e-5)


def test_batch_not_divisible_by_the_world_size_fails_clearly(runs):
    for result in runs[:2]:
        assert "batch_size=7 must be divisible by the world size 2" in result["error"]
