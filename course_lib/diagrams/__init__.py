"""Pictures of ideas, drawn by code: one function per picture, each returning its matplotlib Figure.

These are diagrams, not data plots (except :func:`isoflop_explained`, a real plot of a law): the
book and the notebooks call them so that a picture and the code it explains never disagree. Every
function draws a figure about 8 x 3.5 inches, readable at book width, in the Okabe-Ito palette
(safe for the common colour-vision deficiencies); colour is never the only carrier of meaning,
every part has a label. Letters as everywhere in the course: ``B`` batch, ``S`` query positions,
``Sk`` key positions, ``D`` d_model, ``H`` query heads, ``Hkv`` key/value heads, ``G = H // Hkv``,
``Dh`` head dim, ``F`` feed-forward width, ``V`` vocabulary, ``L`` layers, ``E`` experts, ``K``
experts per token, ``R`` LoRA rank.

============================  =======  ===========================================================
function                      chapter  picture
============================  =======  ===========================================================
:func:`bpe_merges`            01       the lecture's BPE example, one row per merge
:func:`attention_masks`       02       causal, sliding-window and padding masks as grids
:func:`multi_head_split`      02       ``(B, S, D) -> (B, S, H, Dh) -> (B, H, S, Dh)``
:func:`gqa_sharing`           02       which query heads share each key/value head (MHA, GQA, MQA)
:func:`kv_cache`              02       one decoding step with a KV cache
:func:`gpt_architecture`      03       a GPT from token ids to logits, sized by a ``ModelConfig``
:func:`transformer_families`  03       encoder-only, decoder-only, encoder-decoder
:func:`residual_stream`       03       blocks reading from and adding to the residual stream
:func:`norm_positions`        04       post-norm vs pre-norm and the identity (gradient) path
:func:`block_flops`           05       forward FLOPs per token of one block, by matmul
:func:`isoflop_explained`     06       Chinchilla IsoFLOP curves and their compute-optimal minima
:func:`moe_routing`           07       top-K routing with expert capacity and dropped tokens
:func:`lora_adapter`          08       frozen ``W`` beside the trained low-rank ``B A``
:func:`rlhf_pipeline`         09       SFT, reward model and PPO; DPO; RL with verifiable rewards
============================  =======  ===========================================================

One module per chapter (``diagrams.attention``, ``diagrams.moe``...), each drawing one function,
all drawing with the shared kit of ``diagrams._kit`` (palette, sizes, boxes, arrows); every drawing
is also a name of this package, as ``diagrams.kv_cache``. matplotlib is imported inside the
functions, as in :func:`course_lib.train.plot_history`: importing course_lib draws nothing. Pure
diagrams draw on one axes that covers the figure with limits equal to the figure's size, so every
coordinate is in inches.
"""

from .attention import attention_masks, gqa_sharing, kv_cache, multi_head_split
from .flops import block_flops
from .lora import lora_adapter
from .moe import moe_routing
from .normalization import norm_positions
from .rlhf import rlhf_pipeline
from .scaling import isoflop_explained
from .tokenization import bpe_merges
from .transformer import gpt_architecture, residual_stream, transformer_families

__all__ = ["bpe_merges", "gpt_architecture", "transformer_families", "residual_stream", "attention_masks",
           "multi_head_split", "gqa_sharing", "kv_cache", "norm_positions", "block_flops",
           "isoflop_explained", "moe_routing", "lora_adapter", "rlhf_pipeline"]
