"""The transformer and the models built from it: GPT, encoder-only, encoder-decoder (chapter 03).

The package, read in this order:

* ``config``: :class:`ModelConfig`, every choice that fixes a model's shape (norm kind and
  position, positions and RoPE's pairing, MLP kind, GQA, MoE, ...), validated when made;
* ``blocks``: :class:`MLP` and :func:`feed_forward` (an MLP or a mixture of experts),
  :class:`Block` (attention + MLP on the residual stream, pre- or post-norm, drawn there) and
  :class:`DecoderBlock` (with cross-attention);
* ``gpt``: :class:`GPT`, the decoder-only language model (KV caches, left padding), and its
  loss ``lm_loss``, which every family uses;
* ``families``: :class:`Encoder` and :class:`MaskedLM` (encoder-only, BERT) with
  :func:`mask_tokens`, and :class:`EncoderDecoder` (T5);
* ``loading``: :func:`load_weights`, a flat dict of weights in either matrix layout
  (``(d_out, d_in)`` as torch, ``(d_in, d_out)`` as GPT-2's Conv1D and JAX);
* ``hf``: :func:`from_hf_gpt2` and :func:`from_hf_llama`, HuggingFace checkpoints as GPTs.

Everything a chapter uses is importable from here (``from course_lib import model``, then
``model.GPT``). Attention is :mod:`course_lib.attention`, positions :mod:`course_lib.positional`,
norms :mod:`course_lib.norms`, the MoE layer :mod:`course_lib.moe` (which depends on nothing
here).

Shapes: ``B`` batch, ``S`` positions, ``D`` d_model, ``F`` feed-forward width, ``V`` vocabulary,
``L`` layers, ``H`` query heads, ``Hkv`` kv heads, ``Dh`` head dim.
"""

from .blocks import MLP, Block, DecoderBlock, feed_forward
from .config import ModelConfig
from .families import Encoder, EncoderDecoder, MaskedLM, mask_tokens
from .gpt import GPT
from .hf import from_hf_gpt2, from_hf_llama
from .loading import load_weights

__all__ = ["ModelConfig", "MLP", "feed_forward", "Block", "GPT", "Encoder", "MaskedLM", "mask_tokens",
           "DecoderBlock", "EncoderDecoder", "from_hf_gpt2", "from_hf_llama", "load_weights"]
