"""`BertConfig`: a BERT's sizes and options, read from a Hugging Face ``config.json``, and the
name tables shared by loading (`attnkit.models.bert`) and saving (`attnkit.models.bert_save`).
"""

from __future__ import annotations

from dataclasses import MISSING, dataclass, fields, replace
from pathlib import Path

from attnkit.models import checkpoint as ckpt
from attnkit.modules._checks import positive_int, probability

__all__ = ["HF_ACTIVATIONS", "OVERRIDABLE", "POSITION_TYPES", "QKV", "BertConfig"]

# position_embedding_type: transformers' learned table ("absolute", the only kind a BERT
# checkpoint holds here), or attnkit's own fixed sinusoidal table (Vaswani et al. 2017, §3.5)
# or rotary positions (RoPE on q and k in every layer, RoFormer's BERT): no table at all.
POSITION_TYPES = ("absolute", "sinusoidal", "rotary")

# Hugging Face `hidden_act` -> attnkit activation. HF "gelu" is the exact erf form
# (transformers.activations.GELUActivation -> F.gelu); "gelu_new" is the tanh form.
HF_ACTIVATIONS = {
    "gelu": "gelu",
    "gelu_new": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
    "relu": "relu",
    "silu": "silu",
    "swish": "silu",
}

QKV = ("query", "key", "value")

# Config fields `from_pretrained(dir, **overrides)` may change: none of them sets a tensor
# shape, so the saved weights still fit.
OVERRIDABLE = (
    "hidden_dropout_prob",
    "attention_probs_dropout_prob",
    "classifier_dropout",
    "layer_norm_eps",
    "hidden_act",
    "initializer_range",
)


@dataclass(frozen=True)
class BertConfig:
    """The fields of a Hugging Face BERT ``config.json`` that the encoder uses."""

    vocab_size: int  # rows of the word embedding
    hidden_size: int  # C
    num_hidden_layers: int  # L
    num_attention_heads: int  # H; head width C // H
    intermediate_size: int  # F, the feed-forward hidden width
    hidden_act: str = "gelu"  # key of HF_ACTIVATIONS
    hidden_dropout_prob: float = 0.1  # on embeddings and each sublayer output (training)
    attention_probs_dropout_prob: float = 0.1  # on attention probabilities (training)
    max_position_embeddings: int = 512  # longest input, [CLS] and [SEP] included
    type_vocab_size: int = 2  # segments (sentence A / B)
    layer_norm_eps: float = 1e-12  # inside the square root of every LayerNorm
    pad_token_id: int = 0
    model_type: str = "bert"  # one of checkpoint.SUPPORTED_MODEL_TYPES
    position_embedding_type: str = "absolute"  # one of POSITION_TYPES ("absolute": HF's)
    initializer_range: float = 0.02  # std of new weights (heads, resized embeddings)
    classifier_dropout: float | None = None  # BertClassifier's; None: hidden_dropout_prob

    def __post_init__(self) -> None:
        if self.model_type not in ckpt.SUPPORTED_MODEL_TYPES:
            raise ValueError(
                f"model_type {self.model_type!r} is not supported: wanted one of "
                f"{list(ckpt.SUPPORTED_MODEL_TYPES)} (a BertModel layout)"
            )
        if self.position_embedding_type not in POSITION_TYPES:
            raise ValueError(
                f"position_embedding_type {self.position_embedding_type!r} is not supported: "
                f"wanted 'absolute' (or attnkit's own {POSITION_TYPES[1:]})"
            )
        if self.hidden_act not in HF_ACTIVATIONS:
            raise ValueError(
                f"hidden_act {self.hidden_act!r} is not supported: wanted one of "
                f"{sorted(HF_ACTIVATIONS)}"
            )
        sizes = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                 "intermediate_size", "max_position_embeddings", "type_vocab_size")  # fmt: skip
        for name in sizes:
            positive_int(name, getattr(self, name))
        for name in ("hidden_dropout_prob", "attention_probs_dropout_prob"):
            probability(name, getattr(self, name))
        if self.classifier_dropout is not None:
            probability("classifier_dropout", self.classifier_dropout)
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"hidden_size={self.hidden_size} is not divisible by "
                f"num_attention_heads={self.num_attention_heads}"
            )

    @classmethod
    def from_dict(cls, data: dict, source: str = "config") -> BertConfig:
        """Read the known fields of a config dict; unknown fields are ignored."""
        known = {f.name: f for f in fields(cls)}
        required = [n for n, f in known.items() if f.default is MISSING]
        missing = [n for n in required if n not in data]
        if missing:
            raise ValueError(f"{source}: missing field {missing[0]!r}")
        if "model_type" not in data:
            raise ValueError(f"{source}: missing field 'model_type' (wanted 'bert')")
        try:
            return cls(**{k: v for k, v in data.items() if k in known})
        except ValueError as e:
            raise ValueError(f"{source}: {e}") from None

    @classmethod
    def from_json(cls, path: str | Path) -> BertConfig:
        """Read a ``config.json``."""
        return cls.from_dict(ckpt.read_config_json(Path(path)), source=str(path))

    def with_overrides(self, **overrides) -> BertConfig:
        """A copy with some of the `OVERRIDABLE` fields changed (dropout, eps, ...);
        ValueError naming an unknown or shape-setting field and the known ones."""
        for name in overrides:
            if name not in OVERRIDABLE:
                why = "sets the shape of saved weights" if name in _FIELDS else "is unknown"
                raise ValueError(
                    f"override {name!r} {why}: known overrides are {', '.join(OVERRIDABLE)}"
                )
        return replace(self, **overrides)


_FIELDS = {f.name for f in fields(BertConfig)}
