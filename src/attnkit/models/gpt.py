"""A GPT (Radford et al. 2018, 2019) built from attnkit's blocks: the decoder-only language model.

Dimensions: B batch, N new tokens, S tokens seen so far (cached + new), C model width
(d_model), F feed-forward width, H heads, V vocabulary.

    tokens -> token table + learned positions -> dropout      (rotary=True: no position table;
                                                               RoPE rotates q and k instead)
           -> n_layer x [x + attn(LN(x)), causal] [x + FF(LN(x))]   (pre-norm, GPT-2)
           -> LN -> token table^T (tied) -> logits

Every id is a real token: there is no padding id unless `pad_id` is given, and
then it only marks labels the loss ignores (a right-padded batch needs no key
mask: causal attention never lets a real token see the pads after it). Prompts
of different lengths are left-padded and carry an `attention_mask` (B, S),
True / 1 = real token; positions then count real tokens only, so a left-padded
row sees exactly what it would see alone.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnkit.models.decoding import CachedMultiHeadAttention, KVCache
from attnkit.models.generate import generate
from attnkit.models.gpt_step import decode_step
from attnkit.models.transformer import _TiedModule, lm_loss
from attnkit.modules._checks import positive_int, probability
from attnkit.modules.blocks import ACTIVATIONS, FeedForward, PreNormResidual
from attnkit.modules.embed import LearnedPositionalEmbedding
from attnkit.modules.positions import RotaryEmbedding

__all__ = ["GPT", "GPTBlock", "GPTConfig"]


@dataclass(frozen=True)
class GPTConfig:
    """Hyper-parameters of `GPT` (nanoGPT's names)."""

    vocab_size: int  # V, every id in [0, V) is a real token
    n_layer: int  # blocks
    n_head: int  # attention heads H
    d_model: int  # model width C
    context: int  # longest sequence the positions cover (nanoGPT's block_size)
    dropout: float = 0.0  # on embeddings, attention probabilities and sublayer outputs
    d_ff: int | None = None  # feed-forward width F (None: 4·C, as GPT-2)
    activation: str = "gelu"  # feed-forward activation (GPT-2: "gelu_tanh")
    bias: bool = True  # biases in the linear layers
    norm_eps: float = 1e-5  # LayerNorm epsilon
    label_smoothing: float = 0.0  # of the loss; 0 is plain next-token cross-entropy
    pad_id: int | None = None  # a label the loss ignores (None: every id is real)
    rotary: bool = False  # RoPE on q and k (rotate-half, the whole head width) for positions

    def __post_init__(self) -> None:
        for name in ("vocab_size", "n_layer", "n_head", "d_model", "context"):
            positive_int(name, getattr(self, name))
        positive_int("d_ff", self.d_ff, optional=True)
        probability("dropout", self.dropout)
        probability("label_smoothing", self.label_smoothing)
        if self.d_model % self.n_head:
            raise ValueError(f"d_model={self.d_model} must be divisible by n_head={self.n_head}")
        if self.activation not in ACTIVATIONS:
            raise ValueError(
                f"activation must be one of {sorted(ACTIVATIONS)}, got {self.activation!r}"
            )
        if self.pad_id is not None and not 0 <= self.pad_id < self.vocab_size:
            raise ValueError(
                f"pad_id must be None or a token id < {self.vocab_size}, got {self.pad_id}"
            )

    def to_dict(self) -> dict:
        return asdict(self)


class _TokenTable(nn.Embedding):
    """The token table, N(0, 0.02) as in GPT-2: it is also the output layer (tied)."""

    def reset_parameters(self) -> None:
        nn.init.normal_(self.weight, std=0.02)


class GPTBlock(nn.Module):
    """x + attn(LN(x)) with a causal mask, then x + FF(LN(x)) (pre-norm, GPT-2 §2.3)."""

    def __init__(self, cfg: GPTConfig, *, device=None, dtype=None) -> None:
        super().__init__()
        fk = {"device": device, "dtype": dtype}
        c = cfg.d_model
        rotary = RotaryEmbedding(c // cfg.n_head, **fk) if cfg.rotary else None
        attn = CachedMultiHeadAttention(
            c, cfg.n_head, dropout=cfg.dropout, qkv_bias=cfg.bias, out_bias=cfg.bias,
            rotary=rotary, **fk,
        )  # fmt: skip
        hidden = cfg.d_ff or 4 * c
        ff = FeedForward(c, hidden, activation=cfg.activation, bias=cfg.bias, **fk)
        self.attn = PreNormResidual(attn, nn.LayerNorm(c, eps=cfg.norm_eps, **fk), cfg.dropout)
        self.ff = PreNormResidual(ff, nn.LayerNorm(c, eps=cfg.norm_eps, **fk), cfg.dropout)

    def forward(
        self, x: Tensor, *, mask: Tensor | None = None, cache: KVCache | None = None
    ) -> Tensor:
        """x (B, N, C) -> (B, N, C); mask (B, 1, 1, S) True = may attend, or None."""
        return self.ff(self.attn(x, mask=mask, causal=True, cache=cache))


class GPT(_TiedModule):
    """Decoder-only Transformer language model.

    forward(ids (B, N), cache=None, attention_mask=None) -> logits (B, N, V):
    logits[:, t] predict the token after ids[:, t]. With a `KVCache`, ids are
    the N new tokens only. `device`, `dtype`: of the parameters, as for
    `torch.nn.Linear`.
    """

    def __init__(self, cfg: GPTConfig, *, device=None, dtype=None) -> None:
        super().__init__()
        fk = {"device": device, "dtype": dtype}
        self.cfg = cfg
        self.tokens = _TokenTable(cfg.vocab_size, cfg.d_model, **fk)
        self.positions = (
            None if cfg.rotary else LearnedPositionalEmbedding(cfg.context, cfg.d_model, **fk)
        )
        self.drop = nn.Dropout(cfg.dropout) if cfg.dropout > 0 else nn.Identity()
        self.blocks = nn.ModuleList(GPTBlock(cfg, **fk) for _ in range(cfg.n_layer))
        self.norm = nn.LayerNorm(cfg.d_model, eps=cfg.norm_eps, **fk)
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False, **fk)
        self._retie()

    def _retie(self) -> None:
        self.head.weight = self.tokens.weight  # tied input and output embeddings (GPT-2)

    @property
    def context(self) -> int:
        """The most tokens the model sees at once (`generate` slides its window past it)."""
        return self.cfg.context

    def forward(
        self,
        ids: Tensor,
        *,
        cache: KVCache | None = None,
        attention_mask: Tensor | None = None,
    ) -> Tensor:
        """ids (B, N) -> logits (B, N, V).

        attention_mask: (B, S) True / 1 = real token, 0 = padding, over the cached
            tokens and the N new ones (S = cache.length + N); None = all real.
            Padding is masked as a key and not counted in positions; a padding
            query sees no key, its output is well defined (no NaN) but meaningless.
        """
        _check_ids(ids)
        if cache is not None and attention_mask is None and ids.shape[1] == 1:
            # the same step without module calls
            logits = decode_step(self, ids, cache, block_type=GPTBlock, tokens_type=_TokenTable)
            if logits is not None:
                return logits
        offset = 0 if cache is None else cache.length
        x = self.tokens(ids)  # (B, N, C)
        if attention_mask is None:
            mask = None
            if self.positions is not None:
                x = self.positions(x, offset)  # positions offset .. offset + N - 1
        else:
            keep = _check_mask(attention_mask, ids, offset)  # (B, S) bool
            mask = keep[:, None, None, :]  # (B, 1, 1, S)
            if self.positions is not None:
                pos = (keep.cumsum(-1) - 1).clamp(min=0)[:, offset:]  # (B, N): real tokens before
                x = x + F.embedding(pos, self.positions.weight)
            # RoPE needs no such count: q·k depends on the distance between two tokens only, and
            # left padding shifts the query and every real key of a row alike.
        if self.training:  # eval: dropout is the identity (one module call saved per step)
            x = self.drop(x)
        for block in self.blocks:
            x = block(x, mask=mask, cache=cache)
        if cache is not None:
            cache.length += ids.shape[1]
        return self.head(self.norm(x))

    def loss(self, ids: Tensor) -> Tensor:
        """Next-token cross-entropy over ids (B, T), predicted from ids[:, :-1].

        Labels equal to `pad_id` are ignored; a batch with no label left gives 0
        (and zero gradients), never NaN.
        """
        return lm_loss(self(ids[:, :-1]), ids[:, 1:], self.cfg.pad_id, self.cfg.label_smoothing)

    def generate(self, ids: Tensor, max_new_tokens: int, **kwargs) -> Tensor:
        """Continue ids (B, P): see `attnkit.models.generate.generate` for the options."""
        return generate(self, ids, max_new_tokens, **kwargs)


def _check_ids(ids: Tensor) -> Tensor:
    if not isinstance(ids, Tensor) or ids.dim() != 2 or ids.dtype.is_floating_point:
        got = f"{ids.dtype} {tuple(ids.shape)}" if isinstance(ids, Tensor) else type(ids).__name__
        raise ValueError(f"ids must be integer token ids of shape (B, N), got {got}")
    return ids


def _check_mask(mask: Tensor, ids: Tensor, offset: int) -> Tensor:
    want = (ids.shape[0], offset + ids.shape[1])
    if not isinstance(mask, Tensor) or tuple(mask.shape) != want:
        got = tuple(mask.shape) if isinstance(mask, Tensor) else type(mask).__name__
        raise ValueError(f"attention_mask must have shape (B, cached + new) = {want}, got {got}")
    return mask if mask.dtype == torch.bool else mask != 0
