"""course_lib.diagrams: every picture is a Figure that draws cleanly and fast, names what it shows,
shows what its inputs imply (checked against independent counts and course_lib's own functions),
and rejects bad input with a ValueError.

Pure diagrams draw on one axes in inches, so the geometric checks below compare positions and
sizes directly.
"""

from __future__ import annotations

import math
import re
import subprocess
import sys
import time
import warnings
from collections import Counter, defaultdict

import matplotlib

matplotlib.use("Agg")  # before pyplot is imported anywhere: no window, no display needed
import matplotlib.figure  # noqa: E402
import matplotlib.patches  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402
import matplotlib.text  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from matplotlib.collections import PatchCollection  # noqa: E402

from course_lib import bpe, diagrams, flops, model  # noqa: E402
from course_lib.attention import masks  # noqa: E402
from course_lib.moe import routing  # noqa: E402
from course_lib.scaling import ChinchillaLaw  # noqa: E402


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def texts(fig) -> list[str]:
    return [t.get_text() for t in fig.findobj(matplotlib.text.Text) if t.get_text()]


def text_objects(fig) -> list[matplotlib.text.Text]:
    return [t for t in fig.findobj(matplotlib.text.Text) if t.get_text()]


def drawn(fig):
    """Render with every warning an error: a missing glyph or bad mathtext fails here."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fig.canvas.draw()
    return fig


@pytest.mark.parametrize("name", diagrams.__all__)
def test_every_picture_is_a_readable_figure_that_closes(name):
    start = time.perf_counter()
    fig = drawn(getattr(diagrams, name)())
    seconds = time.perf_counter() - start
    assert isinstance(fig, matplotlib.figure.Figure)
    assert fig.number in plt.get_fignums()  # made by pyplot, so it shows inline in Jupyter
    width, height = fig.get_size_inches()
    assert width == 8 and 3.3 <= height <= 3.7
    small = [(t.get_text(), t.get_fontsize()) for t in text_objects(fig) if t.get_fontsize() < 9]
    assert not small, f"text below 9 pt: {small}"
    assert seconds < 5, f"{name} took {seconds:.1f} s (well under 1 s on an idle machine)"
    plt.close(fig)
    assert fig.number not in plt.get_fignums()


def test_importing_the_module_draws_nothing():
    code = "import sys, course_lib.diagrams; assert 'matplotlib.pyplot' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


# ------------------------------------------------------------------------------------ chapter 01

def bpe_rows(fig) -> list[str]:
    """The strings in the cells: one-character texts grouped by height, read left to right."""
    rows = defaultdict(list)
    for t in text_objects(fig):
        if len(t.get_text()) == 1:
            x, y = t.get_position()
            rows[round(y, 3)].append((x, t.get_text()))
    return ["".join(c for _, c in sorted(cells)) for _, cells in sorted(rows.items(), reverse=True)]


def test_bpe_merges_default_is_the_lecture_example():
    fig = diagrams.bpe_merges()
    assert bpe_rows(fig) == ["aaabdaaabac", "ZabdZabac", "ZYdZYac", "XdXac"]
    labels = texts(fig)
    assert {"Z = aa", "Y = ab", "X = ZY"} <= set(labels)
    assert "no pair occurs twice: stop" in labels
    # the same merges as course_lib's trainer (ties to the lowest ids), letters for new ids
    merges = bpe.train("aaabdaaabac", 259, pattern=None).merges
    symbol = {i: chr(i) for i in range(256)} | {256: "Z", 257: "Y", 258: "X"}
    as_rules = [f"{symbol[new]} = {symbol[a]}{symbol[b]}" for (a, b), new in merges.items()]
    assert as_rules == ["Z = aa", "Y = ab", "X = ZY"]


@pytest.mark.parametrize("text", ["abababab", "low_lower_lowest", "xyz", "a"])
def test_bpe_merges_computes_each_texts_own_rows(text):
    fig = drawn(diagrams.bpe_merges(text))
    rows = bpe_rows(fig)
    rules = [t for t in texts(fig) if re.fullmatch(r". = ..", t)]
    assert rows[0] == text and len(rules) == len(rows) - 1
    for before, after, rule in zip(rows[:-1], rows[1:], rules, strict=True):
        new, pair = rule[0], rule[4:]
        counts = Counter(a + b for a, b in zip(before, before[1:], strict=False))
        assert counts[pair] == max(counts.values()) >= 2  # the most frequent pair
        assert new not in before and before.replace(pair, new) == after  # left to right, no overlaps
    last = Counter(a + b for a, b in zip(rows[-1], rows[-1][1:], strict=False))
    assert max(last.values(), default=0) < 2


@pytest.mark.parametrize("text", ["", "a b", "x" * 25, 42, "tab\there"])
def test_bpe_merges_bad_input(text):
    with pytest.raises(ValueError, match="text must be"):
        diagrams.bpe_merges(text)


# ------------------------------------------------------------------------------------ chapter 02

def filled_and_masked(ax) -> tuple[int, int]:
    """Cells of a mask grid: (allowed, masked), told apart by the masked ones' hatching."""
    counts = [0, 0]
    for c in ax.collections:
        if isinstance(c, PatchCollection):
            counts[bool(c.get_hatch())] += len(c.get_paths())
    return counts[0], counts[1]


@pytest.mark.parametrize("S, window, n_pad", [(6, 3, 2), (16, 1, 0), (1, 1, 0), (5, 5, 4)])
def test_attention_masks_match_course_lib_masks(S, window, n_pad):
    fig = drawn(diagrams.attention_masks(S=S, window=window, n_pad=n_pad))
    assert len(fig.axes) == 3
    expected = [
        S * (S + 1) // 2,                                   # causal: query i sees i + 1 keys
        sum(min(i + 1, window) for i in range(S)),          # sliding window: at most `window`
        S * (S - n_pad),                                    # padding: every query, S - n_pad keys
    ]
    assert expected[0] == int(masks.causal_mask(S).sum())
    for ax, allowed in zip(fig.axes, expected, strict=True):
        assert ax.get_xlabel() == "key position" and ax.get_ylabel() == "query position"
        assert filled_and_masked(ax) == (allowed, S * S - allowed)
    titles = [ax.get_title() for ax in fig.axes]
    assert titles[0] == "causal" and f"window of {window}" in titles[1] and f"last {n_pad} keys" in titles[2]


@pytest.mark.parametrize("kwargs", [{"S": 0}, {"S": 17}, {"window": 0}, {"window": 7}, {"n_pad": 6},
                                    {"n_pad": -1}, {"S": 6.0}, {"S": True}])
def test_attention_masks_bad_input(kwargs):
    with pytest.raises(ValueError, match="must be an int"):
        diagrams.attention_masks(**kwargs)


def test_multi_head_split_names_shapes_and_heads():
    labels = texts(diagrams.multi_head_split(H=4, Dh=3))
    chain = next(t for t in labels if t.startswith("(B, S, D)"))
    assert chain.index("(B, S, D)") < chain.index("(B, S, H, Dh)") < chain.index("(B, H, S, Dh)")
    assert "view" in chain and "transpose(1, 2)" in chain
    assert [t for t in labels if t.startswith("head ")] == [f"head {h}" for h in range(4)]
    assert any("4 × 3 = 12" in t for t in labels) and "Dh = 3" in labels
    narrow = texts(drawn(diagrams.multi_head_split(H=16, Dh=4)))
    assert {f"h{h}" for h in range(16)} <= set(narrow) and any("16 × 4 = 64" in t for t in narrow)


@pytest.mark.parametrize("kwargs", [{"H": 0}, {"Dh": 0}, {"H": 17}, {"H": 16, "Dh": 5}])
def test_multi_head_split_bad_input(kwargs):
    with pytest.raises(ValueError, match="must be"):
        diagrams.multi_head_split(**kwargs)


@pytest.mark.parametrize("H, Hkv, kind", [(8, 2, "GQA"), (8, 8, "MHA"), (8, 1, "MQA"), (12, 4, "GQA")])
def test_gqa_sharing_names_heads_groups_and_links(H, Hkv, kind):
    fig = drawn(diagrams.gqa_sharing(H=H, Hkv=Hkv))
    labels = texts(fig)
    G = H // Hkv
    assert sorted(t for t in labels if re.fullmatch(r"q\d+", t)) == sorted(f"q{h}" for h in range(H))
    assert sorted(t for t in labels if re.fullmatch(r"kv\d+", t)) == sorted(f"kv{g}" for g in range(Hkv))
    title = next(t for t in labels if t.startswith(kind))
    assert f"H = {H}" in title and f"Hkv = {Hkv}" in title and f"G = H / Hkv = {G}" in title
    assert any(t.startswith(f"G = {G} query head") for t in labels)
    # one line per query head, from it down to the kv head of its group
    centre = {t.get_text(): t.get_position()[0] for t in text_objects(fig)}
    links = [ln for ln in fig.axes[0].get_lines() if len(ln.get_xdata()) == 2]
    assert len(links) == H
    for ln in links:
        (xq, xkv) = ln.get_xdata()
        h = next(h for h in range(H) if math.isclose(centre[f"q{h}"], xq))
        assert math.isclose(centre[f"kv{h // G}"], xkv)


@pytest.mark.parametrize("H, Hkv", [(8, 3), (8, 0), (4, 8), (0, 1), (17, 1)])
def test_gqa_sharing_bad_input(H, Hkv):
    with pytest.raises(ValueError, match="must be"):
        diagrams.gqa_sharing(H=H, Hkv=Hkv)


@pytest.mark.parametrize("step", [4, 1, 9])
def test_kv_cache_shows_cached_and_new_rows(step):
    labels = Counter(texts(drawn(diagrams.kv_cache(step=step))))
    for j in range(step):  # cached once each
        assert labels[f"k{j}"] == labels[f"v{j}"] == 1
    assert labels[f"k{step}"] == labels[f"v{step}"] == 2  # computed now, then appended
    assert labels[f"q{step}"] == 1 and f"k{step + 1}" not in labels
    assert all(labels[f"s{j}"] == 1 for j in range(step + 1)) and f"s{step + 1}" not in labels  # one per key
    assert any(f"of the {step + 1} scores" in t for t in labels)
    assert labels["append"] == 2 and labels["K cache"] == labels["V cache"] == 1


def _box_of(fig, label):
    """The (x0, y0, x1, y1) of the box whose centre holds the text ``label``."""
    ax = fig.axes[0]
    t = next(t for t in text_objects(fig) if t.get_text() == label)
    x, y = t.get_position()
    for p in ax.patches:
        if isinstance(p, matplotlib.patches.FancyBboxPatch):
            x0, y0, w, h = p.get_x(), p.get_y(), p.get_width(), p.get_height()
            if x0 < x < x0 + w and y0 < y < y0 + h:
                return x0, y0, x0 + w, y0 + h
    raise AssertionError(f"no box around {label!r}")


def _arrows(fig):
    """The points of every arrow, as drawn (in inches)."""
    return [p._path_original.vertices for p in fig.axes[0].patches
            if isinstance(p, matplotlib.patches.FancyArrowPatch)]


@pytest.mark.parametrize("step", [1, 4, 9])
def test_kv_cache_output_is_fed_by_the_scores_and_the_values_not_the_keys(step):
    fig = drawn(diagrams.kv_cache(step=step))
    out = next(t for t in texts(fig) if t.startswith("output"))
    x0, y0, x1, y1 = _box_of(fig, out)
    into = [a for a in _arrows(fig)  # the arrows that end on the output box
            if x0 - 1e-6 <= a[-1][0] <= x1 + 1e-6 and y0 - 1e-6 <= a[-1][1] <= y1 + 1e-6]
    rows = {name: (_box_of(fig, name)[1] + _box_of(fig, name)[3]) / 2 for name in (f"s{step}", "v0", "k0")}
    starts = sorted(round(float(a[0][1]), 6) for a in into)
    assert starts == sorted(round(rows[n], 6) for n in (f"s{step}", "v0"))  # from the scores and the values
    # every key feeds its own score
    for j in range(step + 1):
        kx0, _, kx1, _ = _box_of(fig, f"s{j}")
        assert any(kx0 < a[-1][0] < kx1 and abs(a[0][1] - a[-1][1]) > 0 for a in _arrows(fig)), j


@pytest.mark.parametrize("step", [0, 10, 2.5])
def test_kv_cache_bad_input(step):
    with pytest.raises(ValueError, match="step must be an int"):
        diagrams.kv_cache(step=step)


# ------------------------------------------------------------------------------------ chapter 03

def test_transformer_families_names_the_three_and_their_masks():
    fig = diagrams.transformer_families()
    joined = " ".join(texts(fig))
    for key in ("Encoder-only", "Decoder-only", "Encoder-decoder", "BERT", "GPT", "T5", "bidirectional",
                "causal", "cross-attention"):
        assert key in joined, key
    # four 5 x 5 mask icons: two full (encoders), two lower triangles (decoders, 10 masked each)
    cells = [filled_and_masked(ax) for ax in fig.axes]
    assert sum(a for a, _ in cells) == 2 * 25 + 2 * 15 and sum(m for _, m in cells) == 2 * 10


CHAR_GPT = model.ModelConfig(vocab_size=256, context_length=64, d_model=128, n_layers=2, n_heads=4,
                             positional="rope", norm="rmsnorm", mlp="swiglu")  # chapter 03's


def _k_params(n: int) -> str:
    """The label an independent count should produce: ``66 k params`` style (3 significant digits)."""
    for factor, prefix in ((1e6, "M"), (1e3, "k")):
        if n >= factor:
            return f"{n / factor:.3g} {prefix} params"
    return f"{n} params"


@pytest.mark.parametrize("config", [
    CHAR_GPT, model.ModelConfig(),
    model.ModelConfig(n_kv_heads=1, tie_embeddings=False, d_model=96, n_heads=6),
    model.ModelConfig(vocab_size=50_257, context_length=1024, d_model=768, n_layers=12, n_heads=12),  # GPT-2
], ids=["chapter 03", "defaults", "untied MQA", "GPT-2 small"])
def test_gpt_architecture_counts_what_the_model_holds(config):
    fig = drawn(diagrams.gpt_architecture(config))
    joined = "\n".join(texts(fig))
    D, F, V, Hkv, Dh = config.d_model, config.ff_width, config.vocab_size, config.kv_heads, config.head_dim
    bias = config.bias
    # counted by hand, independently of the model: q, o are D x D; k, v are D x Hkv Dh
    attn = 2 * D * D + 2 * D * Hkv * Dh + (2 * D + 2 * Hkv * Dh if bias else 0)
    n_up = 2 if config.mlp == "swiglu" else 1  # SwiGLU has a gate beside the up projection
    mlp = (n_up + 1) * D * F + ((n_up * F + D) if bias else 0)
    norm = D * (2 if config.norm == "layernorm" and bias else 1)
    block = attn + mlp + 2 * norm
    positions = config.context_length * D if config.positional == "learned" else 0
    total = V * D * (1 if config.tie_embeddings else 2) + positions + config.n_layers * block + norm
    assert total == model.GPT(config).num_params()
    assert f"GPT: {total:,} parameters" in joined
    assert f"{_k_params(attn)}" in joined and f"{_k_params(mlp)}" in joined
    assert f"repeated L = {config.n_layers} times ({_k_params(block)} each)" in joined
    assert f"H = {config.n_heads}, Hkv = {Hkv}" in joined
    assert ("RoPE on q and k" in joined) == (config.positional == "rope")
    assert ("positions" in joined) == (config.positional == "learned")
    assert ("tied: head and" in joined) == config.tie_embeddings
    assert ("untied" in joined) == (not config.tie_embeddings)
    assert ("SwiGLU" in joined) == (config.mlp == "swiglu")
    assert joined.count("RMS\nNorm" if config.norm == "rmsnorm" else "Layer\nNorm") == 2  # one per sublayer
    # each branch comes back down into the stream beside, never through, a box: the attention
    # branch's + sits left of the MLP's norm (it once ran into it and read attention -> norm -> +)
    boxes = [p for p in fig.axes[0].patches  # the labelled boxes, not the frame around the block
             if isinstance(p, matplotlib.patches.FancyBboxPatch) and p.get_zorder() >= 2]
    for a in _arrows(fig):
        (xa, ya), (xb, yb) = a[-2], a[-1]
        if abs(xa - xb) < 1e-9 and yb < ya:  # a last segment straight down: a branch coming back
            for p in boxes:
                x0, x1, y0, y1 = p.get_x(), p.get_x() + p.get_width(), p.get_y(), p.get_y() + p.get_height()
                assert not (x0 - 0.05 < xa < x1 + 0.05 and y0 < ya and yb < y1), \
                    f"the line down at x = {xa:.2f} runs into the box at x {x0:.2f} .. {x1:.2f}"


@pytest.mark.parametrize("config, match", [
    ("gpt2", "config must be a model.ModelConfig"),
    (model.ModelConfig(norm_position="post"), "pre-norm GPT with dense MLPs"),
])
def test_gpt_architecture_bad_input(config, match):
    with pytest.raises(ValueError, match=match):
        diagrams.gpt_architecture(config)


@pytest.mark.parametrize("n_layers", [1, 2, 4])
def test_residual_stream_has_a_read_and_add_per_sublayer(n_layers):
    labels = Counter(texts(drawn(diagrams.residual_stream(n_layers=n_layers))))
    assert labels["attention"] == labels["MLP"] == n_layers
    assert labels["norm"] == labels["+"] == 2 * n_layers  # pre-norm: a norm before each sublayer
    assert all(labels[f"block {b}"] == 1 for b in range(1, n_layers + 1))
    assert labels["final norm"] == 1 and labels["token + position embedding"] == 1
    assert labels["x ← x + attention(norm(x))"] == labels["x ← x + MLP(norm(x))"] == n_layers


@pytest.mark.parametrize("n_layers", [0, 5, 2.0, True])
def test_residual_stream_bad_input(n_layers):
    with pytest.raises(ValueError, match="n_layers must be an int"):
        diagrams.residual_stream(n_layers=n_layers)


# ------------------------------------------------------------------------------------ chapter 04

def test_norm_positions_puts_norms_on_the_identity_path_only_in_post_norm():
    fig = diagrams.norm_positions()
    labels = texts(fig)
    assert any(t.startswith("post-norm") for t in labels) and any(t.startswith("pre-norm") for t in labels)
    assert "gradient path: identity, no norm" in labels and "gradient path: through every norm" in labels
    norms = [t.get_position()[0] for t in text_objects(fig) if t.get_text() == "norm"]
    streams = sorted({t.get_position()[0] for t in text_objects(fig) if t.get_text() == "block input"})
    post, pre = streams  # the identity path of each panel is the vertical line at these x
    assert sum(math.isclose(x, post) for x in norms) == 2  # both norms sit on post-norm's path
    assert not any(math.isclose(x, pre) for x in norms)    # none on pre-norm's
    assert sum(x > 4 for x in norms) == 2                   # pre-norm's are on the branches


# ------------------------------------------------------------------------------------ chapter 05

def one_block_flops(D, S, F):
    return 2 * 3 * D * D + 2 * S * D + 2 * S * D + 2 * D * D + 2 * 2 * D * F


@pytest.mark.parametrize("D, S, H, d_ff", [(768, 1024, 12, None), (64, 16, 4, 100), (4096, 8192, 32, 14336)])
def test_block_flops_total_matches_the_formulas_and_course_lib_flops(D, S, H, d_ff):
    labels = texts(drawn(diagrams.block_flops(d_model=D, seq_len=S, n_heads=H, d_ff=d_ff)))
    F = 4 * D if d_ff is None else d_ff
    total = int(re.search(r"total ([\d,]+) FLOPs", " ".join(labels)).group(1).replace(",", ""))
    assert total == one_block_flops(D, S, F)
    config = model.ModelConfig(vocab_size=10, context_length=S, d_model=D, n_layers=1, n_heads=H, d_ff=d_ff)
    count = flops.flops_per_token(config, S)
    assert total == count.total - count.head  # one layer of flops_per_token, without the unembedding
    values = [int(m.group(1).replace(",", "")) for t in labels if (m := re.match(r"([\d,]+)  \(", t))]
    assert values == [6 * D * D, 2 * S * D, 2 * S * D, 2 * D * D, 4 * D * F] and sum(values) == total
    assert {"2 · 3 · D · D", "2 · S · D", "2 · D · D", "2 · 2 · D · F"} <= set(labels)
    assert any("training ≈ 3 × forward" in t for t in labels)


@pytest.mark.parametrize("kwargs", [{"d_model": 768, "n_heads": 5}, {"d_model": 0}, {"seq_len": 0},
                                    {"d_ff": 0}, {"n_heads": 0}])
def test_block_flops_bad_input(kwargs):
    with pytest.raises(ValueError, match="must be"):
        diagrams.block_flops(**kwargs)


# ------------------------------------------------------------------------------------ chapter 06

@pytest.mark.parametrize("budgets", [(1e18, 1e19, 1e20), (1e21, 1e17), (3e20,)])
def test_isoflop_explained_marks_minima_that_grow_with_compute(budgets):
    fig = drawn(diagrams.isoflop_explained(budgets))
    ax = fig.axes[0]
    assert ax.get_xlabel() == "parameters N" and ax.get_ylabel() == "loss (nats per token)"
    assert ax.get_xscale() == "log"
    (optimal,) = [ln for ln in ax.get_lines() if ln.get_label() == "compute-optimal N grows with C"]
    assert optimal.get_linestyle() == "--"
    N = list(optimal.get_xdata())
    assert N == sorted(N) and len(set(N)) == len(budgets)  # increasing with C
    law = ChinchillaLaw()
    assert N == pytest.approx([law.compute_optimal(C)[0] for C in sorted(budgets)])
    curves = [ln for ln in ax.get_lines() if ln.get_label().startswith("C = ")]
    assert len(curves) == len(budgets)
    for curve, n_opt in zip(curves, N, strict=True):  # each mark is its curve's lowest point
        x, y = curve.get_xdata(), curve.get_ydata()
        assert x[y.argmin()] == pytest.approx(n_opt, rel=0.05)
    assert "compute-optimal N grows with C" in texts(fig)


@pytest.mark.parametrize("budgets", [(), (-1e18,), (1e18, 1e18), ("many",), None, (float("inf"),),
                                     tuple(10.0**k for k in range(7))])
def test_isoflop_explained_bad_input(budgets):
    with pytest.raises(ValueError, match="budgets must be"):
        diagrams.isoflop_explained(budgets)


# ------------------------------------------------------------------------------------ chapter 07

def expert_slots(fig) -> list[tuple[int, int]]:
    found = (re.search(r"slots (\d+)/(\d+)", t) for t in texts(fig))
    return [(int(m.group(1)), int(m.group(2))) for m in found if m]


@pytest.mark.parametrize("kwargs", [{}, {"n_tokens": 12, "E": 8, "K": 2}, {"capacity_factor": 0.3},
                                    {"capacity_factor": 2.0, "seed": 3}, {"n_tokens": 1, "E": 1}])
def test_moe_routing_respects_capacity_and_draws_the_drops(kwargs):
    args = {"n_tokens": 6, "E": 4, "K": 1, "capacity_factor": 1.0, "seed": 0, **kwargs}
    fig = drawn(diagrams.moe_routing(**args))
    T, E, K = args["n_tokens"], args["E"], args["K"]
    capacity = math.ceil(args["capacity_factor"] * T * K / E)
    slots = expert_slots(fig)
    assert len(slots) == E and all(c == capacity and 0 <= k <= capacity for k, c in slots)
    # the same router as course_lib.moe.routing on the same seeded logits
    logits = torch.randn(T, E, generator=torch.Generator().manual_seed(args["seed"]))
    expected = routing.route(logits, top_k=K, capacity=capacity)
    dropped = sum(t.startswith("dropped") for t in texts(fig))
    assert dropped == expected.dropped
    assert [k for k, _ in slots] == expected.kept_load.tolist()
    assert sum(k for k, _ in slots) + dropped == T * K
    dashed = [p for p in fig.axes[0].patches
              if isinstance(p, matplotlib.patches.FancyArrowPatch) and p.get_linestyle() == "--"]
    assert len(dashed) == dropped


def test_moe_routing_default_drops_a_token_and_is_deterministic():
    first = texts(diagrams.moe_routing())
    assert sum(t.startswith("dropped") for t in first) >= 1
    assert texts(diagrams.moe_routing()) == first


@pytest.mark.parametrize("kwargs", [{"K": 5}, {"E": 0}, {"n_tokens": 0}, {"n_tokens": 13}, {"seed": -1},
                                    {"capacity_factor": 0}, {"capacity_factor": -1.0},
                                    {"capacity_factor": "1"}])
def test_moe_routing_bad_input(kwargs):
    with pytest.raises(ValueError, match="must be"):
        diagrams.moe_routing(**kwargs)


# ------------------------------------------------------------------------------------ chapter 08

@pytest.mark.parametrize("d_in, d_out, R", [(8, 8, 2), (64, 16, 16), (3, 40, 1)])
def test_lora_adapter_draws_matrices_to_scale(d_in, d_out, R):
    fig = drawn(diagrams.lora_adapter(d_in=d_in, d_out=d_out, R=R))
    W, B, A = [p for p in fig.axes[0].patches if type(p) is matplotlib.patches.Rectangle]
    size = {name: (p.get_width(), p.get_height()) for name, p in zip("WBA", (W, B, A), strict=True)}
    u = size["W"][0] / d_in
    assert size == {"W": pytest.approx((d_in * u, d_out * u)), "B": pytest.approx((R * u, d_out * u)),
                    "A": pytest.approx((d_in * u, R * u))}
    assert W.get_facecolor() != B.get_facecolor() == A.get_facecolor()  # frozen vs trained
    joined = " ".join(texts(fig))
    for key in ("frozen", "trained, starts at 0", "trained, starts random", r"\frac{\alpha}{R}",
                f"{R * (d_in + d_out)} numbers", f"d_in · d_out = {d_in * d_out}"):
        assert key in joined, key


@pytest.mark.parametrize("kwargs", [{"d_in": 2, "R": 3}, {"d_out": 1, "R": 2}, {"R": 0}, {"d_in": 0},
                                    {"R": 2.0}])
def test_lora_adapter_bad_input(kwargs):
    with pytest.raises(ValueError, match="must be an int"):
        diagrams.lora_adapter(**kwargs)


# ------------------------------------------------------------------------------------ chapter 09

def test_rlhf_pipeline_names_every_stage_and_both_shortcuts():
    joined = " ".join(texts(diagrams.rlhf_pipeline())).replace("\n", " ")
    for key in ("pretrained model", "supervised fine-tuning", "preference pairs", "reward model", "PPO",
                "KL penalty", "reference", "DPO", "verifiable rewards", "checker", "aligned policy"):
        assert key in joined, key
