"""A GPT (Radford et al. 2018, 2019) built from attnkit's blocks: the decoder-only language model.

Dimensions: B batch, N new tokens, S tokens seen so far (cached + new), C model width
(d_model), F feed-forward width, H heads, V vocabulary.

    tokens -> token table + positions -> dropout      (positions="learned" (GPT-2) or
                                                       "sinusoidal" tables; "rotary": no
                                                       table, RoPE rotates q and k instead)
           -> n_layer x [x + attn(LN(x)), causal] [x + FF(LN(x))]   (pre-norm, GPT-2)
           -> LN -> token table^T (tied) -> logits

Every id is a real token: there is no padding id unless `pad_id` is given, and
then it only marks labels the loss ignores (a right-padded batch needs no key
mask: causal attention never lets a real token see the pads after it). Prompts
of different lengths are left-padded and carry an `attention_mask` (B, S),
True / 1 = real token; positions then count real tokens only, so a left-padded
row sees exactly what it would see alone.

A packed batch (several documents per row, no padding) carries `document_ids` (B, N): each
token attends causally to its own document only (`masks.document(ids, causal=True)`, whose
kernels skip the other documents' keys), and positions restart at each document
(`masks.document_positions`), so every document gets exactly the logits it gets alone. The
loss then ignores the labels that start a document: the last token of a document predicts
nothing of the next one.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
from torch import Tensor, nn

from attnkit.functional import masks
from attnkit.models.decoding import CachedMultiHeadAttention, KVCache
from attnkit.models.generate import generate
from attnkit.models.gpt_step import decode_step
from attnkit.models.transformer import _TiedModule, lm_loss
from attnkit.modules._checks import per_token, positive_int, probability
from attnkit.modules.blocks import ACTIVATIONS, FeedForward, PreNormResidual
from attnkit.modules.embed import LearnedPositionalEmbedding, SinusoidalPositionalEncoding
from attnkit.modules.positions import RotaryEmbedding

__all__ = ["GPT", "POSITIONS", "GPTBlock", "GPTConfig"]

POSITIONS = ("learned", "sinusoidal", "rotary")  # GPTConfig.positions


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
    rotary: bool = False  # RoPE: the older spelling of positions="rotary" (saved configs)
    # positions: "learned" table (GPT-2), "sinusoidal" (Vaswani et al. 2017, §3.5, no
    # parameters) or "rotary" (RoPE on q and k, rotate-half, the whole head width; no table)
    positions: str = "learned"

    def __post_init__(self) -> None:
        if self.positions not in POSITIONS:
            raise ValueError(f"positions must be one of {POSITIONS}, got {self.positions!r}")
        if self.rotary and self.positions == "learned":  # GPTConfig(rotary=True), older configs
            object.__setattr__(self, "positions", "rotary")
        elif self.rotary and self.positions != "rotary":
            raise ValueError(
                f"rotary=True contradicts positions={self.positions!r}: pass positions alone"
            )
        object.__setattr__(self, "rotary", self.positions == "rotary")
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
        self,
        x: Tensor,
        *,
        mask: Tensor | masks.StructuredMask | None = None,
        cache: KVCache | None = None,
        position_ids: Tensor | None = None,
    ) -> Tensor:
        """x (B, N, C) -> (B, N, C); mask True = may attend, broadcastable to (B, H, N, S)
        (padding (B, 1, 1, S), or a structured mask such as `masks.document`), or None;
        `position_ids` (B|1, N): the tokens' rotary positions (None: after the cached ones)."""
        return self.ff(self.attn(x, mask=mask, causal=True, cache=cache, position_ids=position_ids))


class GPT(_TiedModule):
    """Decoder-only Transformer language model.

    forward(ids (B, N), cache=None, attention_mask=None, document_ids=None,
    position_ids=None) -> logits (B, N, V): logits[:, t] predict the token after
    ids[:, t]. With a `KVCache`, ids are the N new tokens only. `device`, `dtype`: of the
    parameters, as for `torch.nn.Linear`.
    """

    def __init__(self, cfg: GPTConfig, *, device=None, dtype=None) -> None:
        super().__init__()
        fk = {"device": device, "dtype": dtype}
        self.cfg = cfg
        self.tokens = _TokenTable(cfg.vocab_size, cfg.d_model, **fk)
        self.positions = _position_table(cfg, fk)  # None with rotary positions
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
        document_ids: Tensor | None = None,
        position_ids: Tensor | None = None,
    ) -> Tensor:
        """ids (B, N) -> logits (B, N, V).

        attention_mask: (B, S) True / 1 = real token, 0 = padding, over the cached
            tokens and the N new ones (S = cache.length + N); None = all real.
            Padding is masked as a key and not counted in positions; a padding
            query sees no key, its output is well defined (no NaN) but meaningless.
        document_ids: (B, S) or (S,) integer document ids of a packed batch, over the cached
            tokens and the N new ones as `attention_mask` (`masks.document_ids(lengths)`
            makes them from lengths): a token attends, causally, to its own document only,
            and positions restart at each document, so each document gets the logits it
            would get alone. Padding, if any, is a document of its own
            (`masks.document_ids(lengths, total)`); not combined with `attention_mask`.
            Without a cache the mask stays a description (`masks.document`) that the
            kernels read; over a cache it is the boolean (B|1, 1, N, S) of the new rows.
        position_ids: (B, N) or (N,) positions of the N new tokens, overriding those above
            (transformers' ``position_ids``); for a learned table each < `context`.
        """
        _check_ids(ids)
        plain = attention_mask is None and document_ids is None and position_ids is None
        if cache is not None and plain and ids.shape[1] == 1:
            # the same step without module calls
            logits = decode_step(self, ids, cache, block_type=GPTBlock, tokens_type=_TokenTable)
            if logits is not None:
                return logits
        offset = 0 if cache is None else cache.length
        mask, pos, rotary_pos = None, None, None  # pos (B|1, N): the new tokens' positions
        if attention_mask is not None:
            if document_ids is not None:
                raise ValueError(
                    "pass document_ids or attention_mask, not both: give padding a document "
                    "id of its own (masks.document_ids(lengths, total) does)"
                )
            keep = _check_mask(attention_mask, ids, offset)  # (B, S) bool
            mask = keep[:, None, None, :]  # (B, 1, 1, S)
            pos = (keep.cumsum(-1) - 1).clamp(min=0)[:, offset:]  # (B, N): real tokens before
            # RoPE needs no such count: q·k depends on the distance between two tokens only, and
            # left padding shifts the query and every real key of a row alike.
        if document_ids is not None:
            docs = _check_documents(document_ids, ids, offset)  # (B|1, S)
            mask = _document_mask(docs, ids.shape[1])
            pos = rotary_pos = masks.document_positions(docs)[:, offset:]  # (B|1, N)
        if position_ids is not None:
            pos = rotary_pos = position_ids
        x = self.tokens(ids)  # (B, N, C)
        if self.positions is not None:
            # positions offset .. offset + N - 1, or those given
            x = self.positions(x, offset) if pos is None else self.positions(x, position_ids=pos)
        if self.training:  # eval: dropout is the identity (one module call saved per step)
            x = self.drop(x)
        rotary_pos = rotary_pos if self.cfg.rotary else None
        for block in self.blocks:
            x = block(x, mask=mask, cache=cache, position_ids=rotary_pos)
        if cache is not None:
            cache.length += ids.shape[1]
        return self.head(self.norm(x))

    def loss(self, ids: Tensor, *, document_ids: Tensor | None = None) -> Tensor:
        """Next-token cross-entropy over ids (B, T), predicted from ids[:, :-1].

        Labels equal to `pad_id` are ignored; a batch with no label left gives 0
        (and zero gradients), never NaN. With `document_ids` (B, T) or (T,) of a packed batch
        (see `forward`) the label of each token that starts a document is ignored too: a
        document's last token predicts nothing of the next document, so the loss is the
        mean over the documents' own next-token predictions (its sum, the sum of the
        documents' losses alone).
        """
        if document_ids is None:
            return lm_loss(self(ids[:, :-1]), ids[:, 1:], self.cfg.pad_id, self.cfg.label_smoothing)
        _check_ids(ids)
        docs = _check_documents(document_ids, ids, 0)  # (B|1, T)
        ignore = -100 if self.cfg.pad_id is None else self.cfg.pad_id  # lm_loss's ignored label
        labels = ids[:, 1:].masked_fill(docs[:, 1:] != docs[:, :-1], ignore)  # (B, T - 1)
        logits = self(ids[:, :-1], document_ids=docs[:, :-1])  # (B, T - 1, V)
        return lm_loss(logits, labels, ignore, self.cfg.label_smoothing)

    def generate(self, ids: Tensor, max_new_tokens: int, **kwargs) -> Tensor:
        """Continue ids (B, P): see `attnkit.models.generate.generate` for the options
        (``document_ids=`` continues the last document of packed prompts)."""
        return generate(self, ids, max_new_tokens, **kwargs)


def _position_table(cfg: GPTConfig, fk: dict) -> nn.Module | None:
    if cfg.positions == "learned":
        return LearnedPositionalEmbedding(cfg.context, cfg.d_model, **fk)
    if cfg.positions == "sinusoidal":
        return SinusoidalPositionalEncoding(cfg.d_model, cfg.context, **fk)
    return None  # rotary: the attention layers rotate q and k


def _check_documents(document_ids: Tensor, ids: Tensor, offset: int) -> Tensor:
    """document_ids (S,) or (B, S), S = offset + N, as an int64 (B|1, S) tensor."""
    over = " over the cached + new tokens" if offset else ""
    s = offset + ids.shape[1]
    return per_token(document_ids, ids.shape[0], s, name="document_ids", over=over)


def _document_mask(docs: Tensor, n: int) -> masks.StructuredMask | Tensor:
    """The causal document mask of the last n of S tokens: the description itself when the
    whole sequence is new (n == S), else the boolean rows (B|1, 1, N, S), same id (the block's
    causal=True, bottom-right aligned, does the rest): a cached decode step's N is small."""
    if n == docs.shape[1]:
        return masks.document(docs, causal=True)
    return (docs[:, -n:, None] == docs[:, None, :])[:, None]  # (B|1, 1, N, S)


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
