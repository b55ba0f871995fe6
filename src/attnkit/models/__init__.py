"""Models built from attnkit modules: a BERT encoder that loads Hugging Face checkpoints,
the encoder-decoder Transformer with cached decoding, a GPT and a decoder-only causal LM
that `generate` continues (greedy or sampled), DETR's transformer (positions in every layer,
learned object queries), RNN encoder-decoders (with and without attention), the Universal
Transformer, and ViT / T2T-ViT / a small CNN with CBAM for images (presets in
`attnkit.models.vit.PRESETS`)."""

from attnkit.models.bert import BertConfig, BertEncoder, BertOutput
from attnkit.models.bert_heads import BertClassifier, SequenceClassifierOutput
from attnkit.models.checkpoint import default_checkpoint
from attnkit.models.decoding import CachedMultiHeadAttention, KVCache, beam_search, greedy
from attnkit.models.detr import DetrDecoder, DetrEncoder, DetrTransformer
from attnkit.models.generate import generate
from attnkit.models.gpt import GPT, GPTBlock, GPTConfig
from attnkit.models.rnn import RNNConfig, RNNSeq2Seq
from attnkit.models.tokenize import (
    BatchEncoding,
    Encoding,
    TextTooLong,
    Tokenizer,
    mean_pool,
    sentence_embedding,
)
from attnkit.models.transformer import (
    PRESETS,
    CausalLM,
    DecoderBlock,
    Transformer,
    TransformerConfig,
    pad_mask,
    preset,
)
from attnkit.models.universal import UniversalConfig, UniversalOutput, UniversalTransformer
from attnkit.models.vit import CNNConfig, PatchEmbed, SmallCNN, T2TEmbed, ViT, ViTConfig

__all__ = [
    "GPT",
    "PRESETS",
    "BatchEncoding",
    "BertClassifier",
    "BertConfig",
    "BertEncoder",
    "BertOutput",
    "CNNConfig",
    "CachedMultiHeadAttention",
    "CausalLM",
    "DecoderBlock",
    "DetrDecoder",
    "DetrEncoder",
    "DetrTransformer",
    "Encoding",
    "GPTBlock",
    "GPTConfig",
    "KVCache",
    "PatchEmbed",
    "RNNConfig",
    "RNNSeq2Seq",
    "SequenceClassifierOutput",
    "SmallCNN",
    "T2TEmbed",
    "TextTooLong",
    "Tokenizer",
    "Transformer",
    "TransformerConfig",
    "UniversalConfig",
    "UniversalOutput",
    "UniversalTransformer",
    "ViT",
    "ViTConfig",
    "beam_search",
    "default_checkpoint",
    "generate",
    "greedy",
    "mean_pool",
    "pad_mask",
    "preset",
    "sentence_embedding",
]
