"""Models built from attnkit modules: a BERT encoder that loads Hugging Face checkpoints,
the encoder-decoder Transformer with cached decoding, and a decoder-only causal LM."""

from attnkit.models.bert import BertConfig, BertEncoder, BertOutput
from attnkit.models.checkpoint import default_checkpoint
from attnkit.models.decoding import CachedMultiHeadAttention, KVCache, beam_search, greedy
from attnkit.models.tokenize import Encoding, Tokenizer, mean_pool, sentence_embedding
from attnkit.models.transformer import (
    PRESETS,
    CausalLM,
    DecoderBlock,
    Transformer,
    TransformerConfig,
    pad_mask,
    preset,
)

__all__ = [
    "PRESETS",
    "BertConfig",
    "BertEncoder",
    "BertOutput",
    "CachedMultiHeadAttention",
    "CausalLM",
    "DecoderBlock",
    "Encoding",
    "KVCache",
    "Tokenizer",
    "Transformer",
    "TransformerConfig",
    "beam_search",
    "default_checkpoint",
    "greedy",
    "mean_pool",
    "pad_mask",
    "preset",
    "sentence_embedding",
]
