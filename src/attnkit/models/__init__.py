"""Models built from attnkit modules: a BERT encoder that loads Hugging Face checkpoints."""

from attnkit.models.bert import BertConfig, BertEncoder, BertOutput
from attnkit.models.checkpoint import default_checkpoint
from attnkit.models.tokenize import Encoding, Tokenizer, mean_pool, sentence_embedding

__all__ = [
    "BertConfig",
    "BertEncoder",
    "BertOutput",
    "Encoding",
    "Tokenizer",
    "default_checkpoint",
    "mean_pool",
    "sentence_embedding",
]
