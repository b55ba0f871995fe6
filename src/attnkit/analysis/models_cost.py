"""Whole-model costs (BERT, ViT, encoder-decoder Transformer), layer by layer.

Built from `attnkit.analysis.cost.mha_cost` plus the other parts of a block:
LayerNorm, the position-wise feed-forward network (two Linear layers) and
embeddings (a lookup: parameters, no MACs). Dimensions: B batch, N tokens,
C width, F feed-forward width, V vocabulary.

Parameter counts follow the reference implementations and are pinned by the
tests to ``sum(p.numel())`` of the matching torch modules:

* BERT (Devlin et al. 2019; Hugging Face ``BertModel`` with its pooler);
* ViT (Dosovitskiy et al. 2021; timm's ``VisionTransformer``: class token,
  learned position embedding, pre-norm blocks, final norm, linear head);
* Transformer (Vaswani et al. 2017; ``torch.nn.Transformer``, which adds a final
  LayerNorm to the encoder and to the decoder) with the shared source/target
  embedding and tied pre-softmax projection of the paper (§3.4).

Elementwise FLOPs use fixed conventions (not measured, not seen by
`FlopCounterMode`): LayerNorm 7 per element (mean, subtract, square, variance
sum, normalise, scale, shift), GELU 8 (tanh form), ReLU 1, residual add 1.
"""

from __future__ import annotations

from dataclasses import dataclass

from attnkit.analysis._cost_record import ZERO, Cost, _batched, _check_positive
from attnkit.analysis.cost import mha_cost

__all__ = ["ModelCost", "bert_cost", "transformer_cost", "vit_cost"]

LAYERNORM_FLOPS_PER_ELEMENT = 7
GELU_FLOPS_PER_ELEMENT = 8
RELU_FLOPS_PER_ELEMENT = 1


@dataclass(frozen=True)
class ModelCost:
    """Per-part costs of a model, in forward order, and their total."""

    # e.g. {"embeddings": Cost, "layer.0": Cost, ..., "pooler": Cost}
    parts: dict[str, Cost]

    @property
    def total(self) -> Cost:
        return sum(self.parts.values(), ZERO)

    def to_dict(self) -> dict:
        """JSON-friendly: the total's fields at top level, plus ``parts``."""
        return {**self.total.to_dict(), "parts": {k: v.to_dict() for k, v in self.parts.items()}}


# --------------------------------------------------------------------------- building blocks


def _prefixed(cost: Cost, prefix: str) -> Cost:
    """Rename terms so that two attentions in one layer (self, cross) stay apart."""
    return Cost(
        {f"{prefix}{k}": v for k, v in cost.terms.items()},
        cost.params,
        {f"{prefix}{k}": v for k, v in cost.elementwise.items()},
        cost.masked_macs,
        cost.skipped_macs,
        {f"{prefix}{k}": v for k, v in cost.memory.items()},
    )


def _layernorm(tokens: int, dim: int) -> Cost:
    return Cost({}, 2 * dim, {"layernorm": LAYERNORM_FLOPS_PER_ELEMENT * tokens * dim})


def _residual(tokens: int, dim: int) -> Cost:
    return Cost({}, 0, {"residual": tokens * dim})


def _linear(name: str, tokens: int, fan_in: int, fan_out: int, bias: bool = True) -> Cost:
    """nn.Linear on `tokens` rows: [tokens, fan_in]·[fan_in, fan_out]."""
    elementwise = {"bias": tokens * fan_out} if bias else {}
    return Cost({name: tokens * fan_in * fan_out}, fan_in * fan_out + bias * fan_out, elementwise)


def _ffn(tokens: int, dim: int, hidden: int, activation_flops: int) -> Cost:
    """Position-wise feed-forward: Linear(C, F), activation, Linear(F, C) (Vaswani §3.3)."""
    act = Cost({}, 0, {"activation": activation_flops * tokens * hidden})
    return _linear("ffn.up", tokens, dim, hidden) + act + _linear("ffn.down", tokens, hidden, dim)


def _encoder_layer(n: int, dim: int, heads: int, hidden: int, act_flops: int, batch: int) -> Cost:
    """Self-attention + FFN, two LayerNorms and two residual adds (pre- or post-norm alike)."""
    one = (
        _ffn(n, dim, hidden, act_flops)
        + 2 * _layernorm(n, dim)
        + 2 * _residual(n, dim)
        + mha_cost(n, dim, heads)
    )
    return _batched(one, batch)


# --------------------------------------------------------------------------- models


def bert_cost(
    layers: int = 6,
    dim: int = 384,
    heads: int = 12,
    intermediate: int = 1536,
    seq_len: int = 128,
    *,
    vocab: int = 30522,
    max_positions: int = 512,
    type_vocab: int = 2,
    pooler: bool = True,
    batch: int = 1,
) -> ModelCost:
    """BERT encoder; defaults are MiniLM-L6 (all-MiniLM-L6-v2: 22,713,216 parameters).

    Parts: ``embeddings`` (word + position + token-type lookups, LayerNorm),
    ``layer.0`` ... ``layer.{L-1}``, and ``pooler`` (Linear + tanh on the [CLS]
    token only) when `pooler`.
    """
    _check_positive(layers=layers, seq_len=seq_len, vocab=vocab, batch=batch)
    if seq_len > max_positions:
        raise ValueError(f"seq_len={seq_len} exceeds max_positions={max_positions}")
    n = seq_len
    emb = Cost({}, (vocab + max_positions + type_vocab) * dim, {"embedding_add": 2 * n * dim})
    parts = {"embeddings": _batched(emb + _layernorm(n, dim), batch)}
    layer = _encoder_layer(n, dim, heads, intermediate, GELU_FLOPS_PER_ELEMENT, batch)
    parts.update({f"layer.{i}": layer for i in range(layers)})
    if pooler:
        pool = _linear("pooler", 1, dim, dim) + Cost({}, 0, {"tanh": dim})
        parts["pooler"] = _batched(pool, batch)
    return ModelCost(parts)


def vit_cost(
    image: int = 224,
    patch: int = 16,
    dim: int = 768,
    depth: int = 12,
    heads: int = 12,
    mlp_ratio: float = 4.0,
    num_classes: int = 1000,
    in_chans: int = 3,
    class_token: bool = True,
    *,
    batch: int = 1,
) -> ModelCost:
    """Vision Transformer; defaults are ViT-B/16 at 224² (86,567,656 parameters).

    Parts: ``patch_embed`` (a patch×patch convolution with stride patch: one
    [P, in_chans·patch²]·[in_chans·patch², C] product, plus the class token and
    position embedding), ``block.0`` ... ``block.{depth-1}`` on N = P (+1)
    tokens, and ``head`` (final LayerNorm on all tokens, Linear on the class
    token — or on the mean of the tokens without one).
    """
    _check_positive(image=image, patch=patch, depth=depth, in_chans=in_chans, batch=batch)
    if image % patch:
        raise ValueError(f"patch={patch} must divide image={image}")
    p = (image // patch) ** 2
    n = p + int(class_token)
    hidden = int(dim * mlp_ratio)  # timm: int(embed_dim * mlp_ratio)
    embed = _linear("patch_embed", p, in_chans * patch * patch, dim) + Cost(
        {}, (int(class_token) + n) * dim, {"pos_embed_add": n * dim}
    )
    parts = {"patch_embed": _batched(embed, batch)}
    block = _encoder_layer(n, dim, heads, hidden, GELU_FLOPS_PER_ELEMENT, batch)
    parts.update({f"block.{i}": block for i in range(depth)})
    pool = Cost({}, 0, {} if class_token else {"mean_pool": n * dim})
    head = _layernorm(n, dim) + pool + _linear("classifier", 1, dim, num_classes)
    parts["head"] = _batched(head, batch)
    return ModelCost(parts)


def transformer_cost(
    src_len: int,
    tgt_len: int,
    dim: int = 512,
    heads: int = 8,
    ff: int = 2048,
    enc_layers: int = 6,
    dec_layers: int = 6,
    vocab: int = 37000,
    *,
    batch: int = 1,
) -> ModelCost:
    """Encoder-decoder Transformer (base model defaults, Vaswani et al. 2017, table 3).

    Parts: ``embeddings`` (one table shared by source, target and the output
    projection, §3.4), ``encoder.i``, ``encoder.norm``, ``decoder.i`` (causal
    self-attention: see `masked_macs`; cross-attention over the S = src_len
    encoder outputs; FFN; three LayerNorms), ``decoder.norm``, and
    ``generator`` (the tied [tgt_len, C]·[C, V] projection to logits: MACs, no
    new parameters).
    """
    _check_positive(src_len=src_len, tgt_len=tgt_len, vocab=vocab, batch=batch)
    _check_positive(enc_layers=enc_layers, dec_layers=dec_layers)
    n, s = tgt_len, src_len
    # tokens·sqrt(C) scaling and the sinusoidal position add, for both streams
    emb = Cost({}, vocab * dim, {"embedding_scale_add": 2 * (s + n) * dim})
    parts = {"embeddings": _batched(emb, batch)}
    enc = _encoder_layer(s, dim, heads, ff, RELU_FLOPS_PER_ELEMENT, batch)
    parts.update({f"encoder.{i}": enc for i in range(enc_layers)})
    parts["encoder.norm"] = _batched(_layernorm(s, dim), batch)
    dec = (
        _prefixed(mha_cost(n, dim, heads, causal=True), "self_attn.")
        + _prefixed(mha_cost(n, dim, heads, context_len=s), "cross_attn.")
        + _ffn(n, dim, ff, RELU_FLOPS_PER_ELEMENT)
        + 3 * _layernorm(n, dim)
        + 3 * _residual(n, dim)
    )
    parts.update({f"decoder.{i}": _batched(dec, batch) for i in range(dec_layers)})
    parts["decoder.norm"] = _batched(_layernorm(n, dim), batch)
    generator = Cost({"generator": n * dim * vocab}, 0, {})  # tied to the embedding table
    parts["generator"] = _batched(generator, batch)
    return ModelCost(parts)
