"""The Transformer of "Attention Is All You Need" (Vaswani et al. 2017) and a causal LM.

Dimensions: B batch, S source length, T target length, N new target positions
(cached decoding), C model width (d_model), F feed-forward width (d_ff), H heads,
V vocabulary.

Masks follow attnkit's convention, boolean **True = may attend**: padding masks
are (B, 1, 1, S) from the token ids (`pad_mask`); the target self-attention is
also causal (position i sees positions <= i), aligned bottom-right when a
key/value cache makes N != S.

The configuration (`TransformerConfig`, `PRESETS`, `preset`, `config_from_dict`) lives in
`attnkit.models._transformer_config` and is importable from here.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnkit.models._transformer_config import (
    PRESETS,
    TransformerConfig,
    config_from_dict,
    preset,
)
from attnkit.models.decoding import CachedMultiHeadAttention, KVCache
from attnkit.models.generate import generate
from attnkit.modules.blocks import EncoderBlock, FeedForward, residual
from attnkit.modules.embed import LearnedPositionalEmbedding, SinusoidalPositionalEncoding

__all__ = [
    "PRESETS",
    "CausalLM",
    "DecoderBlock",
    "Transformer",
    "TransformerConfig",
    "config_from_dict",
    "pad_mask",
    "preset",
]


def pad_mask(tokens: Tensor, pad_id: int | None) -> Tensor | None:
    """Key-padding mask (B, 1, 1, S) from token ids (B, S): True = may attend (not `pad_id`);
    None (no mask) when `pad_id` is None."""
    if pad_id is None:
        return None
    return (tokens != pad_id)[:, None, None, :]  # (B, 1, 1, S)


class TokenEmbedding(nn.Module):
    """tokens (B, N) -> table[tokens]·√C + positions -> dropout (§3.4, §3.5).

    `offset` is the position of the first token (the cache length when decoding).
    """

    def __init__(self, table: nn.Embedding, positions: nn.Module, dropout: float) -> None:
        super().__init__()
        self.table, self.positions = table, positions
        self.scale = math.sqrt(table.embedding_dim)
        self.drop = nn.Dropout(dropout) if dropout > 0 else nn.Identity()

    def forward(self, tokens: Tensor, offset: int = 0) -> Tensor:
        """(B, N) -> (B, N, C)."""
        if tokens.dim() != 2 or tokens.dtype.is_floating_point:
            raise ValueError(
                f"tokens must be integer ids of shape (B, N), got {tokens.dtype} "
                f"{tuple(tokens.shape)}"
            )
        return self.drop(self.positions(self.table(tokens) * self.scale, offset))


def _attention(cfg: TransformerConfig, fk: dict) -> CachedMultiHeadAttention:
    return CachedMultiHeadAttention(cfg.d_model, cfg.num_heads, dropout=cfg.attn_dropout, **fk)


def _sublayer(fn: nn.Module, cfg: TransformerConfig, fk: dict) -> nn.Module:
    norm = nn.LayerNorm(cfg.d_model, eps=cfg.norm_eps, **fk)
    return residual(fn, norm, dropout=cfg.dropout, norm_first=cfg.norm_first)


def _feed_forward(cfg: TransformerConfig, fk: dict) -> nn.Module:
    ff = FeedForward(cfg.d_model, cfg.d_ff, activation=cfg.activation, dropout=cfg.dropout, **fk)
    return _sublayer(ff, cfg, fk)


class DecoderBlock(nn.Module):
    """Masked self-attention, cross-attention over the encoder output, feed-forward (§3.1).

    Each sublayer is residual with post-norm or pre-norm (`cfg.norm_first`).
    With ``cross_attention=False`` the block is a GPT-style decoder-only block;
    with ``causal=False`` its self-attention sees every target position (DETR's
    decoder, whose object queries are a set, not a sequence).
    `device`, `dtype`: of the parameters, as for `torch.nn.Linear`.
    """

    def __init__(
        self,
        cfg: TransformerConfig,
        *,
        cross_attention: bool = True,
        causal: bool = True,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        fk = {"device": device, "dtype": dtype}
        self.causal = causal
        self.self_attn = _sublayer(_attention(cfg, fk), cfg, fk)
        self.cross_attn = _sublayer(_attention(cfg, fk), cfg, fk) if cross_attention else None
        self.ff = _feed_forward(cfg, fk)

    def forward(
        self,
        x: Tensor,
        memory: Tensor | None = None,
        *,
        mask: Tensor | None = None,
        memory_mask: Tensor | None = None,
        cache: KVCache | None = None,
        pos: Tensor | None = None,
        query_pos: Tensor | None = None,
    ) -> Tensor:
        """x (B, N, C), memory (B, S, C) -> (B, N, C).

        mask: target key-padding mask (B, 1, 1, T) or None, True = may attend;
            unless the block was built with ``causal=False`` the causal mask is
            applied too (bottom-right aligned, so with a cache holding T - N
            positions the N new ones see all of them).
        memory_mask: source key-padding mask (B, 1, 1, S), True = may attend.
        cache: keys/values of earlier steps (see `attnkit.models.decoding`).
        pos: positions of the memory (B, S, C), added to the cross-attention keys.
        query_pos: positions of the targets (B, N, C), added to the self-attention
            queries and keys and to the cross-attention queries.
            Neither ever reaches a value or the residual stream (DETR, §3.2).
        """
        x = self.self_attn(x, mask=mask, causal=self.causal, cache=cache, pos=query_pos)
        if self.cross_attn is not None:
            if memory is None:
                raise ValueError("memory (B, S, C) is required by a block with cross-attention")
            x = self.cross_attn(
                x, memory, mask=memory_mask, cache=cache, pos=query_pos, context_pos=pos
            )
        return self.ff(x)


def _encoder_block(cfg: TransformerConfig, fk: dict) -> EncoderBlock:
    """Self-attention, add & norm, feed-forward, add & norm (§3.1)."""
    return EncoderBlock(
        cfg.d_model,
        cfg.num_heads,
        cfg.d_ff,
        norm_first=cfg.norm_first,
        dropout=cfg.dropout,
        attn_dropout=cfg.attn_dropout,
        activation=cfg.activation,
        norm_eps=cfg.norm_eps,
        **fk,
    )


def _positions(cfg: TransformerConfig, fk: dict) -> nn.Module:
    if cfg.positions == "learned":
        return LearnedPositionalEmbedding(cfg.max_len, cfg.d_model, **fk)
    return SinusoidalPositionalEncoding(cfg.d_model, cfg.max_len, **fk)


class TokenTable(nn.Embedding):
    """A token embedding initialised N(0, 1/C): ·√C in the forward makes the scaled
    embedding unit-variance (§3.4)."""

    def reset_parameters(self) -> None:
        super().reset_parameters()  # the draw nn.Embedding made before: seeded runs unchanged
        nn.init.normal_(self.weight, std=self.embedding_dim**-0.5)


def _final_norm(cfg: TransformerConfig, fk: dict) -> nn.Module:
    # Pre-norm stacks end un-normalised: a last LayerNorm (Xiong et al. 2020).
    return nn.LayerNorm(cfg.d_model, eps=cfg.norm_eps, **fk) if cfg.norm_first else nn.Identity()


def _generator(table: nn.Embedding, cfg: TransformerConfig, fk: dict) -> nn.Linear:
    gen = nn.Linear(cfg.d_model, table.num_embeddings, bias=False, **fk)
    _tie(gen, table, cfg)
    return gen


def _tie(gen: nn.Linear, table: nn.Embedding, cfg: TransformerConfig) -> None:
    if cfg.tie_generator:
        gen.weight = table.weight


class _TiedModule(nn.Module):
    """Keeps `generator.weight` tied to the token table across `to_empty` / `to`: moving
    a parameter off the meta device makes a new one per owner, which would untie it."""

    def _apply(self, fn, recurse=True):
        super()._apply(fn, recurse)
        self._retie()
        return self

    def _retie(self) -> None:
        raise NotImplementedError


def _lm_loss(logits: Tensor, labels: Tensor, cfg: TransformerConfig) -> Tensor:
    """Cross-entropy with label smoothing; `pad_id` labels are ignored. (B, T, V), (B, T)."""
    return lm_loss(logits, labels, cfg.pad_id, cfg.label_smoothing)


def lm_loss(
    logits: Tensor, labels: Tensor, ignore_id: int | None = None, label_smoothing: float = 0.0
) -> Tensor:
    """Mean cross-entropy of logits (B, T, V) against labels (B, T) over the labels that are
    not `ignore_id`; 0 when there are none (`F.cross_entropy`'s mean gives NaN: 0 / 0)."""
    labels = labels.flatten()  # (B·T,)
    ignore = -100 if ignore_id is None else ignore_id  # -100: F.cross_entropy's "none"
    total = F.cross_entropy(
        logits.flatten(0, 1),  # (B·T, V)
        labels,
        ignore_index=ignore,
        label_smoothing=label_smoothing,
        reduction="sum",
    )
    return total / (labels != ignore).sum().clamp(min=1)


class Transformer(_TiedModule):
    """Encoder-decoder Transformer; `generator` returns logits (softmax is in the loss).

    forward(src (B, S), tgt (B, T)) -> logits (B, T, V): tgt is the decoder
    input (BOS y1 ... ), logits[:, t] predict the token after tgt[:, t].
    `device`, `dtype`: of the parameters, as for `torch.nn.Linear`.
    """

    def __init__(
        self,
        cfg: TransformerConfig,
        *,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        fk = {"device": device, "dtype": dtype}
        self.cfg = cfg
        src_table = TokenTable(cfg.src_vocab, cfg.d_model, **fk)
        tgt_table = (
            src_table if cfg.share_embeddings else TokenTable(cfg.tgt_vocab, cfg.d_model, **fk)
        )
        self.src_embed = TokenEmbedding(src_table, _positions(cfg, fk), cfg.dropout)
        self.tgt_embed = TokenEmbedding(tgt_table, _positions(cfg, fk), cfg.dropout)
        self.encoder = nn.ModuleList(_encoder_block(cfg, fk) for _ in range(cfg.encoder_layers))
        self.encoder_norm = _final_norm(cfg, fk)
        self.decoder = nn.ModuleList(DecoderBlock(cfg, **fk) for _ in range(cfg.decoder_layers))
        self.decoder_norm = _final_norm(cfg, fk)
        self.generator = _generator(tgt_table, cfg, fk)

    def _retie(self) -> None:
        _tie(self.generator, self.tgt_embed.table, self.cfg)

    def encode(self, src: Tensor) -> tuple[Tensor, Tensor]:
        """src (B, S) -> memory (B, S, C) and its padding mask (B, 1, 1, S), True = may attend."""
        mask = pad_mask(src, self.cfg.pad_id)
        x = self.src_embed(src)
        for block in self.encoder:
            x = block(x, mask=mask)
        return self.encoder_norm(x), mask

    def decode(
        self,
        tgt: Tensor,
        memory: Tensor,
        memory_mask: Tensor | None,
        *,
        cache: KVCache | None = None,
    ) -> Tensor:
        """tgt (B, N) -> logits (B, N, V).

        Without a cache, tgt is the whole decoder input and its `pad_id`
        positions are masked as keys. With a cache, tgt holds only the N new
        tokens (positions cache.length, ...); no target padding mask is applied
        (decoded tokens are never padding that later tokens must not see).
        """
        offset = 0 if cache is None else cache.length
        mask = pad_mask(tgt, self.cfg.pad_id) if cache is None else None
        x = self.tgt_embed(tgt, offset)
        for block in self.decoder:
            x = block(x, memory, mask=mask, memory_mask=memory_mask, cache=cache)
        if cache is not None:
            cache.length += tgt.shape[1]
        return self.generator(self.decoder_norm(x))

    def forward(self, src: Tensor, tgt: Tensor) -> Tensor:
        """src (B, S), tgt (B, T) -> logits (B, T, V)."""
        memory, memory_mask = self.encode(src)
        return self.decode(tgt, memory, memory_mask)

    def loss(self, src: Tensor, tgt: Tensor) -> Tensor:
        """Teacher-forced loss; tgt (B, T) = BOS y1 ... EOS PAD..., predicted from tgt[:, :-1]."""
        return _lm_loss(self(src, tgt[:, :-1]), tgt[:, 1:], self.cfg)


class CausalLM(_TiedModule):
    """Decoder-only language model from the same `DecoderBlock` (no cross-attention).

    Uses `cfg.src_vocab` as the vocabulary and `cfg.decoder_layers` blocks.
    forward(tokens (B, T), cache=None) -> logits (B, T, V); with a cache,
    tokens are the N new ones only. Every id is a real token unless `cfg.pad_id`
    is set; cached and full forwards then agree for any vocabulary. `device`,
    `dtype`: as for `Transformer`.
    """

    def __init__(
        self,
        cfg: TransformerConfig,
        *,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        fk = {"device": device, "dtype": dtype}
        self.cfg = cfg
        table = TokenTable(cfg.src_vocab, cfg.d_model, **fk)
        self.embed = TokenEmbedding(table, _positions(cfg, fk), cfg.dropout)
        self.blocks = nn.ModuleList(
            DecoderBlock(cfg, cross_attention=False, **fk) for _ in range(cfg.decoder_layers)
        )
        self.norm = _final_norm(cfg, fk)
        self.generator = _generator(table, cfg, fk)

    def _retie(self) -> None:
        _tie(self.generator, self.embed.table, self.cfg)

    def forward(self, tokens: Tensor, *, cache: KVCache | None = None) -> Tensor:
        offset = 0 if cache is None else cache.length
        mask = pad_mask(tokens, self.cfg.pad_id) if cache is None else None
        x = self.embed(tokens, offset)
        for block in self.blocks:
            x = block(x, mask=mask, cache=cache)
        if cache is not None:
            cache.length += tokens.shape[1]
        return self.generator(self.norm(x))

    def loss(self, tokens: Tensor) -> Tensor:
        """Next-token loss over tokens (B, T); `pad_id` labels are ignored."""
        return _lm_loss(self(tokens[:, :-1]), tokens[:, 1:], self.cfg)

    @property
    def context(self) -> int:
        """The most tokens the model sees at once (`generate` slides its window past it)."""
        return self.cfg.max_len

    def generate(
        self,
        ids: Tensor,
        max_new_tokens: int,
        *,
        temperature: float = 0.0,
        top_k: int | None = None,
        top_p: float | None = None,
        eos_id: int | None = None,
        generator: torch.Generator | None = None,
    ) -> Tensor:
        """Continue ids (B, P) -> (B, P + T), T <= max_new_tokens; greedy by default.

        See `attnkit.models.generate.generate` (prompts of different lengths need `GPT`:
        this model's positions cannot skip left padding).
        """
        return generate(
            self,
            ids,
            max_new_tokens,
            temperature=temperature,
            top_k=top_k,
            top_p=top_p,
            eos_id=eos_id,
            generator=generator,
        )
