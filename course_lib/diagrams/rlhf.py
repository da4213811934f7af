"""Chapter 09's diagrams: :func:`rlhf_pipeline`."""

from __future__ import annotations

from ._kit import (
    BLUE,
    GREEN,
    GREY,
    INK,
    SMALL,
    VERMILLION,
    YELLOW,
    _arrow,
    _box,
    _canvas,
)


def rlhf_pipeline():
    """From a pretrained model to an aligned policy: supervised fine-tuning, then preference
    pairs, a reward model and RL (PPO with a KL penalty to the SFT model as reference); DPO as a
    shortcut from the preference pairs straight to the policy; RL with verifiable rewards (a
    checker instead of a reward model) as a third branch from the SFT model."""
    fig, ax = _canvas()
    y, h, w = 1.75, 0.62, 1.2
    _box(ax, 0.75, 2.95, w, 0.5, "pretrained\nmodel", GREY)
    _box(ax, 0.75, y, w, h, "supervised\nfine-tuning\n(SFT)", BLUE, fontsize=SMALL)
    _arrow(ax, (0.75, 2.7), (0.75, y + h / 2))
    _box(ax, 2.25, y, w, h, "preference\npairs (chosen,\nrejected)", YELLOW, fontsize=SMALL)
    _box(ax, 3.75, y, w, h, "reward\nmodel", BLUE, fontsize=SMALL)
    _box(ax, 5.25, y, w, h, "RL: PPO with\nKL penalty to\nreference (SFT)", BLUE, fontsize=SMALL)
    _box(ax, 7.05, y, 1.3, h, "aligned\npolicy", INK, fill="white", weight="bold")
    for a, b in ((0.75, 2.25), (2.25, 3.75), (3.75, 5.25)):
        _arrow(ax, (a + w / 2, y), (b - w / 2, y), color=BLUE)
    _arrow(ax, (5.25 + w / 2, y), (7.05 - 0.65, y), color=BLUE)
    ax.text(4.5, y - h / 2 - 0.12, "RLHF: reward model + PPO", ha="center", va="top", fontsize=SMALL)
    # DPO: from the pairs straight to the policy, over the top
    _arrow(ax, (2.25, y + h / 2), (2.25, 2.95), (7.05, 2.95), (7.05, y + h / 2), color=VERMILLION, lw=1.6,
           ls="--")
    ax.text(4.65, 3.03, "DPO: learn from the pairs directly (no reward model, no RL)", ha="center",
            va="bottom", fontsize=SMALL)
    # RL with verifiable rewards: from the SFT model, scored by a checker
    _box(ax, 3.75, 0.45, 3.7, 0.5, "RL with verifiable rewards: a checker\n(unit tests, exact answers) "
         "replaces the reward model", GREEN, fontsize=SMALL)
    _arrow(ax, (0.75, y - h / 2), (0.75, 0.45), (3.75 - 1.85, 0.45), color=GREEN, lw=1.6)
    _arrow(ax, (3.75 + 1.85, 0.45), (7.05, 0.45), (7.05, y - h / 2), color=GREEN, lw=1.6)
    return fig
