"""Scaling laws: Kaplan et al. (2020) and Chinchilla (Hoffmann et al., 2022) (chapter 06).

Notation: this module keeps the papers' letters, which differ from the rest of the course:
``N`` parameters, ``D`` training tokens (not the model width), ``C`` training compute in FLOPs,
``L`` the loss in nats per token. ``C = 6 N D`` (chapter 05).

* :class:`KaplanLaw`: the one-variable laws ``L(N)``, ``L(D)``, ``L(C)`` with the paper's constants
  (its section 1.2). Kaplan's ``N`` excludes embeddings, and its ``C`` is in PF-days
  (1 PF-day = 8.64e19 FLOPs).
* :class:`KaplanNDLaw`: ``L(N, D)``, the paper's equation 1.5, with its own constants (Table 2),
  which differ from the one-variable fits'. Its ``D`` is the dataset size of a run stopped early.
* :class:`ChinchillaLaw`: ``L(N, D) = E + A / N^alpha + B / D^beta`` with the constants of
  the paper's approach 3, and :meth:`ChinchillaLaw.compute_optimal`, the closed-form best
  ``(N, D)`` for a budget ``C``. With these constants the best tokens-per-parameter ratio
  grows with the budget (about 26 at 1e18 FLOPs); the familiar 20 comes from the paper's
  approaches 1 and 2, and Besiroglu et al. (2024) found the published approach-3 fit
  inconsistent with them.
* Fitting: :func:`fit_chinchilla` (approach 3: Huber loss on log-losses, L-BFGS from a grid
  of starts, as the paper), :func:`isoflop_optimum` and :func:`fit_power_law` (approach 2:
  the loss-minimising ``N`` of each IsoFLOP profile, then ``N_opt = k C^a``), and
  :func:`fit_kaplan_n` (Kaplan's ``L(N)`` as a line in log-log space).
* The sweep: :func:`sweep` trains course_lib GPTs at several budgets and writes a CSV
  (``python -m course_lib.scaling sweep``, ``make sweep``); :func:`read_sweep` reads the
  shipped one.

>>> round(ChinchillaLaw().loss(280e9, 300e9), 3)  # Gopher, as in the first deck
1.993
"""

from __future__ import annotations

import csv
import itertools
import math
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from . import data
from .model import GPT, ModelConfig
from .sweeps import append_rows, parse_command_line
from .train import TrainConfig, train

__all__ = ["PF_DAY", "KaplanLaw", "KaplanNDLaw", "ChinchillaLaw", "fit_chinchilla", "isoflop_optimum",
           "fit_power_law", "fit_kaplan_n", "SWEEP_CSV", "SWEEP_SIZES", "Run", "SWEEP_PLAN", "QUICK_PLAN",
           "sweep_config", "sweep", "read_sweep"]

PF_DAY = 1e15 * 24 * 3600  # FLOPs in a petaflop/s-day, Kaplan's unit of compute


def _positive(name: str, value) -> None:
    values = value if isinstance(value, Sequence) else [value]
    if any(not v > 0 for v in values):
        raise ValueError(f"{name} must be positive, got {value}")


@dataclass(frozen=True)
class KaplanLaw:
    """Kaplan et al. (2020), section 1.2: one variable at a time; losses in nats, N without embeddings."""

    alpha_N: float = 0.076
    N_c: float = 8.8e13
    alpha_D: float = 0.095
    D_c: float = 5.4e13
    alpha_C: float = 0.050
    C_c: float = 3.1e8  # PF-days (C_min)

    def loss_n(self, N: float) -> float:
        """``(N_c / N)^alpha_N``: models of N non-embedding parameters trained to convergence."""
        _positive("N", N)
        return (self.N_c / N) ** self.alpha_N

    def loss_d(self, D: float) -> float:
        """``(D_c / D)^alpha_D``: a large model trained on D tokens with early stopping."""
        _positive("D", D)
        return (self.D_c / D) ** self.alpha_D

    def loss_c(self, C_flops: float) -> float:
        """``(C_c / C)^alpha_C``, C given in FLOPs and converted to PF-days."""
        _positive("C", C_flops)
        return (self.C_c / (C_flops / PF_DAY)) ** self.alpha_C


@dataclass(frozen=True)
class KaplanNDLaw:
    """Kaplan et al. (2020), equation 1.5, with the constants of its Table 2 fit (not those of the
    one-variable laws in :class:`KaplanLaw`): ``L(N, D) = [(N_c / N)^(alpha_N / alpha_D) + D_c / D]^alpha_D``.

    ``N`` excludes embeddings; ``D`` is the size of the dataset of a run stopped early, at its best
    test loss. :meth:`compute_optimal` minimises along ``D = C / (6 N)``, which reads ``D`` as the
    tokens a run of that budget trains on: a reinterpretation, not the paper's own use of it.

    >>> law = KaplanNDLaw()
    >>> round(law.size_exponent, 3)  # N_opt grows as C^0.575
    0.575
    >>> [round(D / N, 1) for N, D in map(law.compute_optimal, [1e19, 1e21, 1e23, 1e25])]
    [8.6, 4.3, 2.1, 1.1]
    """

    alpha_N: float = 0.076
    alpha_D: float = 0.103
    N_c: float = 6.4e13
    D_c: float = 1.8e13

    def loss(self, N: float, D: float) -> float:
        """``[(N_c / N)^(alpha_N / alpha_D) + D_c / D]^alpha_D``; ``(N_c / N)^alpha_N`` as ``D`` grows."""
        _positive("N", N)
        _positive("D", D)
        return ((self.N_c / N) ** (self.alpha_N / self.alpha_D) + self.D_c / D) ** self.alpha_D

    @property
    def size_exponent(self) -> float:
        """``a`` in ``N_opt ~ C^a`` on the line ``6 N D = C``: ``1 / (1 + alpha_N / alpha_D)``."""
        return 1 / (1 + self.alpha_N / self.alpha_D)

    def compute_optimal(self, C: float) -> tuple[float, float]:
        """The ``(N, D)`` minimising the loss subject to ``6 N D = C``, in closed form.

        The loss grows with ``(N_c / N)^r + 6 D_c N / C`` (``r = alpha_N / alpha_D``), whose
        derivative vanishes at ``N^(1 + r) = r N_c^r C / (6 D_c)``; then ``D = C / (6 N)``.
        """
        _positive("C", C)
        r = self.alpha_N / self.alpha_D
        N = (r * self.N_c**r * C / (6 * self.D_c)) ** (1 / (1 + r))
        return N, C / (6 * N)


@dataclass(frozen=True)
class ChinchillaLaw:
    """``L(N, D) = E + A / N^alpha + B / D^beta``; defaults: Hoffmann et al. (2022), approach 3."""

    E: float = 1.69
    A: float = 406.4
    B: float = 410.7
    alpha: float = 0.34
    beta: float = 0.28

    def loss(self, N: float, D: float) -> float:
        _positive("N", N)
        _positive("D", D)
        return self.E + self.A / N**self.alpha + self.B / D**self.beta

    def compute_optimal(self, C: float) -> tuple[float, float]:
        """The ``(N, D)`` that minimise the loss subject to ``6 N D = C``, in closed form.

        Setting the derivative of ``A N^-alpha + B (C / 6N)^-beta`` to zero gives
        ``N = G (C / 6)^(beta / (alpha + beta))`` with ``G = (alpha A / (beta B))^(1 / (alpha + beta))``
        and ``D = C / (6 N)``.
        """
        _positive("C", C)
        s = self.alpha + self.beta
        G = (self.alpha * self.A / (self.beta * self.B)) ** (1 / s)
        N = G * (C / 6) ** (self.beta / s)
        return N, C / (6 * N)


def _huber(r: torch.Tensor, delta: float) -> torch.Tensor:
    return torch.where(r.abs() <= delta, 0.5 * r**2, delta * (r.abs() - 0.5 * delta))


def _lbfgs(objective, start: list[float], max_iter: int) -> tuple[torch.Tensor, float]:
    """Minimise ``objective`` from ``start`` with L-BFGS (float64); returns (parameters, value)."""
    p = torch.tensor(start, dtype=torch.float64, requires_grad=True)
    opt = torch.optim.LBFGS([p], max_iter=max_iter, line_search_fn="strong_wolfe",
                            tolerance_grad=1e-12, tolerance_change=1e-14)

    def closure():
        opt.zero_grad()
        value = objective(p)
        value.backward()
        return value

    opt.step(closure)
    with torch.no_grad():
        return p.detach(), objective(p).item()


def fit_chinchilla(N: Sequence[float], D: Sequence[float], loss: Sequence[float], *, delta: float = 1e-3,
                   grid: dict[str, Sequence[float]] | None = None, max_iter: int = 200) -> ChinchillaLaw:
    """Fit ``E + A / N^alpha + B / D^beta`` to runs as the paper's approach 3.

    Minimises the Huber loss (``delta``) between ``log L`` and the prediction
    ``logsumexp(a - alpha log N, b - beta log D, e)`` over ``(a, b, e, alpha, beta)``, with
    ``A = exp(a)``, ``B = exp(b)``, ``E = exp(e)``, by L-BFGS from every start of ``grid``,
    and keeps the best. The default grid (32 starts) is a coarse version of the paper's.
    """
    if not (len(N) == len(D) == len(loss)):
        raise ValueError(f"N, D and loss need one value per run, got {len(N)}, {len(D)}, {len(loss)}")
    if len(N) < 5:
        raise ValueError(f"need at least 5 runs to fit 5 parameters, got {len(N)}")
    for name, values in (("N", N), ("D", D), ("loss", loss)):
        _positive(name, list(values))
    log_n, log_d, log_l = (torch.tensor(v, dtype=torch.float64).log() for v in (N, D, loss))
    grid = grid or {"alpha": (0.2, 0.6), "beta": (0.2, 0.6), "e": (-1.0, 0.5),
                    "a": (2.0, 12.0), "b": (2.0, 12.0)}

    def objective(p: torch.Tensor) -> torch.Tensor:
        a, b, e, alpha, beta = p
        terms = torch.stack([a - alpha * log_n, b - beta * log_d, e.expand_as(log_n)])  # (3, runs)
        pred = torch.logsumexp(terms, dim=0)
        return _huber(pred - log_l, delta).sum()

    best, best_value = None, math.inf
    names = ("a", "b", "e", "alpha", "beta")  # the order of the parameter vector
    for start in itertools.product(*(grid[name] for name in names)):
        p, value = _lbfgs(objective, list(start), max_iter)
        if math.isfinite(value) and value < best_value:
            best, best_value = p, value
    a, b, e, alpha, beta = best.tolist()
    return ChinchillaLaw(E=math.exp(e), A=math.exp(a), B=math.exp(b), alpha=alpha, beta=beta)


def isoflop_optimum(N: Sequence[float], loss: Sequence[float]) -> float:
    """The loss-minimising N of one IsoFLOP profile: a parabola in ``log N`` through the runs.

    The runs share one compute budget; the vertex of the fitted parabola is the estimate.
    """
    if len(N) != len(loss) or len(N) < 3:
        raise ValueError(f"need at least 3 runs with one loss each, got {len(N)} N and {len(loss)} losses")
    _positive("N", list(N))
    x = torch.tensor(N, dtype=torch.float64).log()
    y = torch.tensor(loss, dtype=torch.float64)
    X = torch.stack([x**2, x, torch.ones_like(x)], dim=1)  # (runs, 3)
    c2, c1, _ = torch.linalg.lstsq(X, y[:, None]).solution.flatten().tolist()
    if c2 <= 0:
        raise ValueError("the profile has no minimum (the parabola opens downward): add runs on both sides")
    return math.exp(-c1 / (2 * c2))


def fit_power_law(x: Sequence[float], y: Sequence[float]) -> tuple[float, float]:
    """``(k, a)`` of ``y = k x^a``, by least squares on ``log y = log k + a log x``."""
    if len(x) != len(y) or len(x) < 2:
        raise ValueError(f"need at least 2 points with one y each, got {len(x)} x and {len(y)} y")
    _positive("x", list(x))
    _positive("y", list(y))
    lx = torch.tensor(x, dtype=torch.float64).log()
    ly = torch.tensor(y, dtype=torch.float64).log()
    X = torch.stack([torch.ones_like(lx), lx], dim=1)  # (points, 2)
    log_k, a = torch.linalg.lstsq(X, ly[:, None]).solution.flatten().tolist()
    return math.exp(log_k), a


def fit_kaplan_n(N: Sequence[float], loss: Sequence[float]) -> KaplanLaw:
    """Kaplan's ``L(N) = (N_c / N)^alpha_N`` fitted to runs; other constants keep their defaults."""
    k, a = fit_power_law(N, loss)  # loss = k N^a with a = -alpha_N, k = N_c^alpha_N
    if a >= 0:
        raise ValueError(f"the loss does not fall with N (fitted exponent {a:.3f})")
    alpha_N = -a
    return KaplanLaw(alpha_N=alpha_N, N_c=k ** (1 / alpha_N))


# --------------------------------------------------------------------------- the sweep
# ``python -m course_lib.scaling sweep`` trains small character-level GPTs on Shakespeare at
# three compute budgets (five sizes each, around the optimum) and one larger held-out run, and
# writes one CSV row per run. The CSV ships with the package so chapter 06 runs in seconds; the
# whole sweep took 21 minutes on 2 CPU cores (1258 s of training). Simplifications: one
# learning rate and batch size for every size, and the smallest models see the corpus up to
# 3-4 times.

SWEEP_CSV = Path(__file__).parent / "results" / "scaling_sweep.csv"

# name: (n_layers, d_model, n_heads); about 8k to 490k parameters, the byte embedding a large
# share of the smallest
SWEEP_SIZES: dict[str, tuple[int, int, int]] = {
    "L2-D12": (2, 12, 1), "L2-D16": (2, 16, 1), "L2-D24": (2, 24, 2), "L2-D32": (2, 32, 2),
    "L2-D48": (2, 48, 3), "L2-D64": (2, 64, 4), "L3-D80": (3, 80, 5), "L3-D112": (3, 112, 7),
}


@dataclass(frozen=True)
class Run:
    """One training run of the sweep: a model size trained on ``budget / (6 N)`` tokens."""

    budget: float        # C in FLOPs, as 6 N D with N all parameters
    size: str            # a key of SWEEP_SIZES
    held_out: bool = False  # kept out of the fits, to check a prediction against


_LADDER = tuple(SWEEP_SIZES)
SWEEP_PLAN: tuple[Run, ...] = (
    *(Run(4e11, s) for s in _LADDER[0:5]),
    *(Run(1.2e12, s) for s in _LADDER[1:6]),
    *(Run(3.6e12, s) for s in _LADDER[3:8]),
    Run(1.08e13, "L2-D64", held_out=True),
)
QUICK_PLAN: tuple[Run, ...] = (Run(2e9, "L2-D16"), Run(2e9, "L2-D32"), Run(6e9, "L2-D32", held_out=True))

SWEEP_COLUMNS = ("budget", "size", "n_layers", "d_model", "n_heads", "params", "non_embedding", "tokens",
                 "compute", "loss", "held_out", "seconds", "curve")


def sweep_config(size: str) -> ModelConfig:
    """The model of one sweep size: bytes (V = 256), 64 positions, GPT-2's layout, sdpa."""
    n_layers, d_model, n_heads = SWEEP_SIZES[size]
    return ModelConfig(vocab_size=256, context_length=64, d_model=d_model, n_layers=n_layers,
                       n_heads=n_heads, attn_impl="sdpa")


def _train_run(run: Run, train_ids: torch.Tensor, val_ids: torch.Tensor) -> dict:
    config = sweep_config(run.size)
    torch.manual_seed(0)
    gpt = GPT(config)
    N = gpt.num_params()
    tokens_per_step = 32 * config.context_length
    steps = max(1, round(run.budget / (6 * N) / tokens_per_step))  # D = C / (6 N), whole steps
    train_config = TrainConfig(max_steps=steps, batch_size=32, lr=2e-3, min_lr=2e-4,
                               warmup_steps=max(1, min(100, steps // 10)), eval_every=max(1, steps // 8),
                               eval_batches=20, precision="fp32")
    start = time.perf_counter()
    history = train(gpt, train_ids, val_ids, train_config, progress=False)
    tokens = steps * tokens_per_step
    return {
        "budget": run.budget, "size": run.size, "n_layers": config.n_layers, "d_model": config.d_model,
        "n_heads": config.n_heads, "params": N, "non_embedding": gpt.num_params(non_embedding=True),
        "tokens": tokens, "compute": 6 * N * tokens, "loss": history.val_loss[-1], "held_out": run.held_out,
        "seconds": round(time.perf_counter() - start, 1),
        "curve": ";".join(f"{s * tokens_per_step}:{v:.4f}"  # tokens seen : validation loss
                          for s, v in zip(history.val_steps, history.val_loss, strict=True)),
    }


def read_sweep(path: str | os.PathLike | None = None) -> list[dict]:
    """The rows of a sweep CSV (default: the shipped one), numbers as numbers.

    ``curve`` becomes a list of ``(tokens seen, validation loss)`` pairs.
    """
    path = Path(path) if path is not None else SWEEP_CSV
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    for row in rows:
        for key in ("budget", "compute", "loss", "seconds"):
            row[key] = float(row[key])
        for key in ("n_layers", "d_model", "n_heads", "params", "non_embedding", "tokens"):
            row[key] = int(row[key])
        row["held_out"] = row["held_out"] == "True"
        row["curve"] = [(int(t), float(v)) for t, v in (p.split(":") for p in row["curve"].split(";"))]
    return rows


def sweep(path: str | os.PathLike, plan: Sequence[Run] = SWEEP_PLAN, *, max_chars: int | None = None,
          progress: bool = True) -> list[dict]:
    """Train every run of ``plan`` not yet in the CSV at ``path``, appending a row after each.

    An interrupted sweep resumes where it stopped: runs already in the file are skipped (a run
    cut off halfway starts again). Returns the rows trained by this call.
    """
    unknown = sorted({r.size for r in plan} - set(SWEEP_SIZES))
    if unknown:
        raise ValueError(f"unknown sizes {unknown}; choose from {sorted(SWEEP_SIZES)}")
    path = Path(path)
    done = {(row["budget"], row["size"]) for row in read_sweep(path)} if path.exists() else set()
    todo = [r for r in plan if (r.budget, r.size) not in done]
    if not todo:
        return []
    train_ids, val_ids = data.train_val_split(data.encode_corpus(data.shakespeare(max_chars)))
    return append_rows(path, SWEEP_COLUMNS, todo, lambda run: _train_run(run, train_ids, val_ids),
                       desc="sweep", progress=progress)


def main(argv: list[str] | None = None) -> int:
    """Command line: ``python -m course_lib.scaling sweep [--out PATH] [--quick] [--threads N]``."""
    args = parse_command_line("python -m course_lib.scaling", "sweep",
                              "train the grid of small models and write (or complete) its CSV",
                              SWEEP_CSV, "scaling_sweep_quick.csv",
                              "three tiny runs on 200k characters: a smoke test", argv)
    plan, max_chars = (QUICK_PLAN, 200_000) if args.quick else (SWEEP_PLAN, None)
    rows = sweep(args.out, plan, max_chars=max_chars)
    print(f"{args.out}: trained {len(rows)} runs in {sum(r['seconds'] for r in rows):.0f} s; "
          f"{len(read_sweep(args.out))} runs in the file")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
