"""The model floor: the sizes (`Config`), the parameter table, the forward and backward passes
built from the component chapters, generation with a KV cache, and the whole-model gradient check.

Imports run down only: this floor uses the components and `xenith_edu.tools`, never the floors
above it (training, exercises, booktools, grader, gradebook, cli).
"""

from .check import check_model
from .checks import check_params, check_targets, check_tokens
from .config import Config, default_ffn_hidden
from .ends import HeadCache, head_backward, head_forward
from .params import LAYER_PARAMS, PARAM, PARAMS, init_params, param_shapes, random_params
from .positions import qk_rope_tables
from .tokenizer import BPETokenizer, CharTokenizer, tokenizer_of
from .transformer import (
    AttentionBlockCache,
    LayerCache,
    ModelCache,
    PastKV,
    SwiGLUBlockCache,
    attention_block_backward,
    attention_block_forward,
    backward,
    forward,
    layer_backward,
    layer_forward,
    layer_params,
    loss_and_grads,
    merge_heads,
    split_heads,
    swiglu_block_backward,
    swiglu_block_forward,
)

__all__ = [
    "LAYER_PARAMS", "PARAM", "PARAMS", "AttentionBlockCache", "BPETokenizer", "CharTokenizer",
    "Config", "HeadCache", "LayerCache", "ModelCache", "PastKV", "SwiGLUBlockCache",
    "attention_block_backward", "attention_block_forward", "backward", "check_model",
    "check_params", "check_targets", "check_tokens", "default_ffn_hidden", "forward",
    "head_backward", "head_forward", "init_params", "layer_backward", "layer_forward",
    "layer_params", "loss_and_grads", "merge_heads", "qk_rope_tables", "param_shapes",
    "random_params", "split_heads", "swiglu_block_backward", "swiglu_block_forward",
    "tokenizer_of",
]
