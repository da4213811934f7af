"""Chapter 03's diagrams: :func:`gpt_architecture`, :func:`transformer_families`, :func:`residual_stream`."""

from __future__ import annotations

from ._kit import (
    ATTENTION,
    BLUE,
    FOCUS,
    FONT,
    GREY,
    INK,
    MLP,
    NORM,
    ORANGE,
    SMALL,
    TITLE,
    WIDTH,
    _arrow,
    _box,
    _canvas,
    _cells,
    _int,
    _plus,
    _si,
    _sublayer,
)


def _params(module) -> str:
    """A module's parameter count, ``66 k params`` style."""
    return f"{_si(sum(p.numel() for p in module.parameters())).rstrip()} params"


def gpt_architecture(config=None):
    """A decoder-only GPT from token ids to logits, drawn for ``config`` (a
    :class:`course_lib.model.ModelConfig`; default: its defaults): the token embedding (plus the
    position table when positions are learned), one pre-norm block standing for all ``L`` (norm,
    causal multi-head attention, +; norm, MLP, +), the final norm and the LM head, with each part's
    parameter count taken from a ``model.GPT(config)`` built on the meta device (shapes, no
    memory). A tied head is drawn as one matrix used twice. Only pre-norm, dense GPTs are drawn."""
    import torch

    from ..model import GPT, ModelConfig

    config = ModelConfig() if config is None else config
    if not isinstance(config, ModelConfig):
        raise ValueError(f"config must be a model.ModelConfig or None, got {type(config).__name__}")
    if config.norm_position != "pre" or config.moe is not None:
        raise ValueError("gpt_architecture draws a pre-norm GPT with dense MLPs")
    with torch.device("meta"):
        gpt = GPT(config)
    c, block = config, gpt.blocks[0]
    norm = "RMSNorm" if c.norm == "rmsnorm" else "LayerNorm"
    fig, ax = _canvas()
    ax.text(WIDTH / 2, 3.3, f"GPT: {gpt.num_params():,} parameters  (V = {c.vocab_size}, D = {c.d_model}, "
            f"L = {c.n_layers}, H = {c.n_heads}, Hkv = {c.kv_heads}, F = {c.ff_width}, "
            f"context {c.context_length})", ha="center", va="center", fontsize=FONT, weight="bold")
    y = 1.45  # the residual stream's height
    ax.text(0.05, y, "token\nids\n(B, S)", va="center", fontsize=SMALL)
    _box(ax, 1.1, y, 0.95, 0.85, f"token\nembedding\nV × D\n{_params(gpt.tok_emb)}", GREY, fontsize=SMALL)
    _arrow(ax, (0.5, y), (0.62, y))
    if gpt.pos_emb is not None:
        _box(ax, 1.1, 0.55, 0.95, 0.6, f"positions\n{c.context_length} × D\n{_params(gpt.pos_emb)}", GREY,
             fontsize=SMALL)
        _plus(ax, 1.7, y)
        _arrow(ax, (1.58, 0.55), (1.7, 0.55), (1.7, y - 0.09))
        _arrow(ax, (1.58, y), (1.7 - 0.09, y))
    # one block, standing for L: the stream runs left to right, each sublayer branches above it
    x0, x1 = 1.85, 6.0
    ax.add_patch(_rect(x0, 0.3, x1 - x0, 2.6))
    ax.text((x0 + x1) / 2, 0.48, f"block, repeated L = {c.n_layers} times ({_params(block)} each)",
            ha="center", va="center", fontsize=SMALL, style="italic")
    ax.plot([1.58, x1 + 0.1], [y, y], color=INK, linewidth=2.5, zorder=1)
    rope = "\nRoPE on q and k" if c.positional == "rope" else ""
    # the attention branch returns (its +) left of the MLP's norm, so no line runs into that box
    sublayers = [(x0 + 0.4, ATTENTION, f"causal attention\nH = {c.n_heads}, Hkv = {c.kv_heads}{rope}\n"
                  f"{_params(block.attn)}"),
                 (x0 + 2.4, MLP, f"MLP, {'SwiGLU' if c.mlp == 'swiglu' else 'GELU'}\nD → F → D\n"
                  f"{_params(block.mlp)}")]
    nw, bw = 0.5, 1.2  # widths of a norm box and a sublayer box
    for xr, color, label in sublayers:
        ax.plot([xr], [y], "o", color=INK, markersize=4, zorder=3)  # the read point
        _arrow(ax, (xr, y), (xr, y + 0.47))
        _box(ax, xr, y + 0.65, nw, 0.36, norm.replace("Norm", "\nNorm"), NORM, fontsize=SMALL)
        left = xr + nw / 2 + 0.06  # the sublayer box's left edge
        _arrow(ax, (xr + nw / 2, y + 0.65), (left, y + 0.65))
        _box(ax, left + bw / 2, y + 0.65, bw, 0.85, label, color, fontsize=SMALL)
        back = left + bw + 0.12  # where the branch comes back down into the stream
        _arrow(ax, (left + bw, y + 0.65), (back, y + 0.65), (back, y + 0.09))
        _plus(ax, back, y)
    ax.text(x0 + 0.15, y - 0.25, "residual stream (B, S, D)", fontsize=SMALL, va="center")
    _box(ax, 6.45, y, 0.7, 0.5, f"final\n{norm}", NORM, fontsize=SMALL)
    _box(ax, 7.45, y, 0.8, 0.6, "LM head\nD → V", GREY, fontsize=SMALL)
    _arrow(ax, (6.8, y), (7.05, y))
    _arrow(ax, (7.45, y + 0.3), (7.45, y + 0.8))
    ax.text(7.45, y + 0.88, "logits (B, S, V)\n→ next-token\nprobabilities", ha="center", va="bottom",
            fontsize=SMALL)
    if c.tie_embeddings:  # one matrix, used twice: drawn as a dashed link under the block
        _arrow(ax, (1.1, y - 0.43), (1.1, 0.1), (7.45, 0.1), (7.45, y - 0.3), color=FOCUS, ls="--")
        ax.text(6.62, 0.65, "tied: head and\nembedding share\none matrix", ha="center", va="center",
                fontsize=SMALL)
    else:
        ax.text(7.45, y - 0.4, f"untied\n{_params(gpt.lm_head)}", ha="center", va="top", fontsize=SMALL)
    return fig


def _rect(x, y, w, h):
    """A pale frame around a block."""
    from matplotlib.patches import FancyBboxPatch

    return FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0,rounding_size=0.08", facecolor="#FAFAFA",
                          edgecolor=GREY, linewidth=1.0, zorder=0.5)


def transformer_families():
    """The three families side by side, each with its self-attention mask as an icon: encoder-only
    (BERT-like, bidirectional), decoder-only (GPT-like, causal), encoder-decoder (T5, the original
    Transformer: a bidirectional encoder, a causal decoder that cross-attends to it)."""
    fig, ax = _canvas()
    n = 5  # cells per side of a mask icon
    full = [[True] * n for _ in range(n)]
    causal = [[j <= i for j in range(n)] for i in range(n)]

    def icon(x, size, allowed, color, label):
        _cells(ax, allowed, x - size / 2, 1.75, size / n, color)
        ax.text(x, 1.75 - size - 0.12, label, ha="center", va="top", fontsize=SMALL)

    columns = [(1.3, "Encoder-only", "BERT-like"), (3.9, "Decoder-only", "GPT-like"),
               (6.5, "Encoder-decoder", "T5, the original Transformer")]
    for x, name, example in columns:
        ax.text(x, 3.25, name, ha="center", va="center", fontsize=TITLE, weight="bold")
        ax.text(x, 2.97, example, ha="center", va="center", fontsize=FONT, style="italic")
    _box(ax, 1.3, 2.35, 2.1, 0.55, "encoder\nbidirectional self-attention", BLUE)
    icon(1.3, 0.75, full, BLUE, "bidirectional:\nevery token sees every token")
    ax.text(1.3, 0.2, "use: classify, embed", ha="center", va="center", fontsize=SMALL)
    _box(ax, 3.9, 2.35, 2.1, 0.55, "decoder\ncausal self-attention", ORANGE)
    icon(3.9, 0.75, causal, ORANGE, "causal:\ntoken i sees tokens 0 .. i")
    ax.text(3.9, 0.2, "use: generate text", ha="center", va="center", fontsize=SMALL)
    _box(ax, 5.8, 2.35, 1.0, 0.55, "encoder\nbidirectional", BLUE)
    _box(ax, 7.2, 2.35, 1.3, 0.65, "decoder\ncausal self-attn\n+ cross-attention", ORANGE, fontsize=SMALL)
    _arrow(ax, (6.3, 2.35), (6.55, 2.35))
    icon(5.8, 0.6, full, BLUE, "encoder:\nbidirectional")
    icon(7.2, 0.6, causal, ORANGE, "decoder:\ncausal")
    ax.text(6.5, 0.2, "use: translate, summarise", ha="center", va="center", fontsize=SMALL)
    return fig


def residual_stream(n_layers: int = 2):
    """The residual stream as a vertical line from the token and position embeddings up to the
    final norm and the unembedding. Each block's attention and MLP read the stream through a norm
    (pre-norm) and add their output back at a + node: ``x <- x + f(Norm(x))``. ``n_layers`` in
    1 .. 4 (the figure grows taller with it)."""
    _int("n_layers", n_layers, 1, 4)
    band, first = 0.55, 0.8  # height per sublayer; height of the first read point
    top = first + band * 2 * n_layers + 0.25
    fig, ax = _canvas(height=top + 0.3)
    x = 2.5
    ax.plot([x, x], [0.5, top], color=INK, linewidth=2.5, zorder=1)
    ax.text(x - 0.2, (first + top) / 2, "residual stream\nx: (B, S, D)", rotation=90, ha="right",
            va="center", fontsize=SMALL)
    _box(ax, x, 0.35, 2.6, 0.32, "token + position embedding", GREY, fontsize=SMALL)
    ax.text(0.1, 0.35, "token ids\n(B, S)", va="center", fontsize=SMALL)
    _arrow(ax, (0.75, 0.35), (x - 1.3, 0.35))
    for layer in range(n_layers):
        y = first + 2 * layer * band
        for k, (name, color) in enumerate((("attention", ATTENTION), ("MLP", MLP))):
            yk = y + k * band
            _sublayer(ax, x, yk, [(3.25, 0.65, "norm", NORM), (4.5, 1.1, name, color)])
            ax.text(5.35, yk + 0.15, f"x ← x + {name}(norm(x))", va="center", fontsize=SMALL)
        y_end = y + band + 0.3
        ax.plot([1.7, 1.6, 1.6, 1.7], [y - 0.05, y - 0.05, y_end + 0.05, y_end + 0.05], color=INK,
                linewidth=1)
        ax.text(1.5, (y + y_end) / 2, f"block {layer + 1}", ha="right", va="center", fontsize=FONT)
    _box(ax, x, top, 1.0, 0.28, "final norm", NORM, fontsize=SMALL, zorder=2.5)
    _box(ax, 4.3, top, 1.7, 0.28, "unembedding D → V", GREY, fontsize=SMALL)
    _arrow(ax, (x + 0.5, top), (4.3 - 0.85, top))
    _arrow(ax, (5.15, top), (5.5, top))
    ax.text(5.55, top, "logits (B, S, V)", va="center", fontsize=SMALL)
    ax.text(5.35, 0.35, "pre-norm: each sublayer reads\nnorm(x) and adds its output back", va="center",
            fontsize=SMALL, style="italic")
    return fig
