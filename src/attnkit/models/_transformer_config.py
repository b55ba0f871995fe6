"""Configuration of the Transformer and the causal LM of `attnkit.models.transformer`:
`TransformerConfig` (the paper's hyper-parameters, checked on construction), its named
presets and its inverse of `to_dict` (for checkpoints)."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from attnkit.models.checkpoint import config_from_fields
from attnkit.modules._checks import nonnegative_int, positive_int, probability

__all__ = ["PRESETS", "TransformerConfig", "config_from_dict", "preset"]


@dataclass(frozen=True)
class TransformerConfig:
    """Hyper-parameters of `Transformer` and `CausalLM` (the paper's names in brackets)."""

    src_vocab: int  # source vocabulary size (CausalLM: the vocabulary)
    tgt_vocab: int  # target vocabulary size (CausalLM: ignored)
    d_model: int = 512  # model width C [d_model]
    num_heads: int = 8  # attention heads H [h]
    d_ff: int = 2048  # feed-forward hidden width F [d_ff]
    encoder_layers: int = 6  # encoder blocks [N]
    decoder_layers: int = 6  # decoder blocks [N]
    dropout: float = 0.1  # on embeddings+positions and every sublayer output [P_drop]
    attn_dropout: float = 0.0  # on attention probabilities (not in the paper)
    norm_first: bool = False  # pre-norm (True) or the paper's post-norm (False)
    share_embeddings: bool = False  # one token table for source and target (§3.4)
    tie_generator: bool = True  # generator weight = target token table (§3.4)
    positions: str = "sinusoidal"  # "sinusoidal" (§3.5) or "learned"
    max_len: int = 1024  # longest sequence the positions cover
    activation: str = "relu"  # feed-forward activation (the paper: ReLU)
    norm_eps: float = 1e-5  # LayerNorm epsilon
    label_smoothing: float = 0.1  # ε_ls of the loss (§5.4)
    pad_id: int | None = None  # padding token: masked as a key, ignored by the loss (None: none)

    def __post_init__(self) -> None:
        for name in ("src_vocab", "tgt_vocab", "d_model", "num_heads", "d_ff", "max_len"):
            positive_int(name, getattr(self, name))
        for name in ("encoder_layers", "decoder_layers"):  # 0: CausalLM has no encoder
            nonnegative_int(name, getattr(self, name))
        for name in ("dropout", "attn_dropout", "label_smoothing"):
            probability(name, getattr(self, name))
        if self.d_model % self.num_heads:
            raise ValueError(
                f"d_model={self.d_model} must be divisible by num_heads={self.num_heads}"
            )
        if self.positions not in ("sinusoidal", "learned"):
            raise ValueError(f"positions must be 'sinusoidal' or 'learned', got {self.positions!r}")
        if self.share_embeddings and self.src_vocab != self.tgt_vocab:
            raise ValueError(
                f"share_embeddings needs src_vocab == tgt_vocab, "
                f"got {self.src_vocab} and {self.tgt_vocab}"
            )
        if self.pad_id is not None and not 0 <= self.pad_id < min(self.src_vocab, self.tgt_vocab):
            raise ValueError(
                f"pad_id must be None or a token id of both vocabularies, got {self.pad_id}"
            )

    def to_dict(self) -> dict:
        return asdict(self)


# Named presets: everything except the vocabulary sizes.
PRESETS: dict[str, dict] = {
    # Table 3, "base": 65M parameters with a 37k shared BPE vocabulary.
    "base": dict(d_model=512, num_heads=8, d_ff=2048, encoder_layers=6, decoder_layers=6),
    # Table 3, "big".
    "big": dict(
        d_model=1024, num_heads=16, d_ff=4096, encoder_layers=6, decoder_layers=6, dropout=0.3
    ),
    # Small and fast on a CPU: the synthetic tasks of attnkit.seq2seq.
    "tiny": dict(
        d_model=64,
        num_heads=4,
        d_ff=256,
        encoder_layers=2,
        decoder_layers=2,
        dropout=0.0,
        norm_first=True,
        label_smoothing=0.0,
        max_len=256,
    ),
}


def preset(name: str, **overrides) -> TransformerConfig:
    """`TransformerConfig` from a named preset; `overrides` must include the vocabularies."""
    if name not in PRESETS:
        raise ValueError(f"preset must be one of {sorted(PRESETS)}, got {name!r}")
    return TransformerConfig(**{**PRESETS[name], **overrides})


def config_from_dict(d: dict) -> TransformerConfig:
    """Inverse of `TransformerConfig.to_dict` (unknown keys are an error)."""
    return config_from_fields(TransformerConfig, d)
