"""RNN encoder-decoders, the models attention was invented for: without attention (Cho et
al. 2014), with additive attention (Bahdanau et al. 2015) and with multiplicative attention
(Luong et al. 2015).

Dimensions: B batch, S source length, T target length, N new target positions (cached
decoding), E embedding width, H decoder state width (= memory width), V vocabulary.

The encoder is a bidirectional GRU or LSTM with H/2 units per direction, run on packed
sequences, so a row's padding never reaches its states; its outputs (B, S, H) are the
memory. Its final state, [forward state at the last real token; backward state at the
first], starts the decoder through s0 = tanh(W_s · final) (Bahdanau A.2.2). One decoder
step, for the three `attention` kinds:

    none      c = final                       s = cell([y; c], s)      o = tanh(W_o [s; c])
    additive  c = attend(s_prev, memory)      s = cell([y; c], s)      o = tanh(W_o [s; c])
    dot/general  s = cell([y; o_prev], s)     c = attend(s, memory)    o = tanh(W_c [s; c])

then logits = W_gen · o. "none" sees only the final encoder state: `encode` returns it as a
memory of length 1 (Cho et al. feed that summary to every step). Additive attention scores
with the previous state (Bahdanau §3.1); dot/general score with the current state and feed
o back as the next input (Luong §3.1, §3.3 "input feeding"). Bahdanau's maxout deep output is
a tanh layer here. The scores are `attnkit.modules.AdditiveAttention` and `LuongAttention`,
so `attnkit.record_attention` records one (B, 1, 1, S) map per decoder step
(`RNNSeq2Seq.alignment` stacks them to (B, T, S)).

Masks: boolean, True = may attend; the key-padding mask of the memory is (B, 1, 1, S).
Sources are padded on the right with `pad_id`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from attnkit.models.checkpoint import config_from_fields
from attnkit.models.decoding import KVCache
from attnkit.modules._checks import positive_int, probability
from attnkit.modules.additive import AdditiveAttention, LuongAttention

__all__ = ["ATTENTIONS", "CELLS", "RNNConfig", "RNNSeq2Seq", "rnn_config_from_dict"]

CELLS = ("gru", "lstm")
ATTENTIONS = ("none", "additive", "dot", "general")


@dataclass(frozen=True)
class RNNConfig:
    """Hyper-parameters of `RNNSeq2Seq` (one vocabulary for source and target)."""

    vocab: int  # vocabulary size V, shared by source and target
    cell: str = "gru"  # "gru" or "lstm", for encoder and decoder
    attention: str = "additive"  # "none", "additive" (Bahdanau), "dot" or "general" (Luong)
    embed_dim: int = 64  # token embedding width E
    hidden: int = 128  # decoder state and memory width H (H/2 per encoder direction)
    dropout: float = 0.0  # on embeddings and on the output layer o
    label_smoothing: float = 0.0  # of the training loss
    pad_id: int = 0  # padding token: masked as a key, ignored by the loss

    def __post_init__(self) -> None:
        for name in ("vocab", "embed_dim", "hidden"):
            positive_int(name, getattr(self, name))
        for name in ("dropout", "label_smoothing"):
            probability(name, getattr(self, name))
        if self.cell not in CELLS:
            raise ValueError(f"cell must be one of {CELLS}, got {self.cell!r}")
        if self.attention not in ATTENTIONS:
            raise ValueError(f"attention must be one of {ATTENTIONS}, got {self.attention!r}")
        if self.hidden % 2:
            raise ValueError(f"hidden must be even (H/2 per encoder direction), got {self.hidden}")
        if not 0 <= self.pad_id < self.vocab:
            raise ValueError(f"pad_id must be a token id, got {self.pad_id} for vocab {self.vocab}")

    def to_dict(self) -> dict:
        return asdict(self)


def rnn_config_from_dict(d: dict) -> RNNConfig:
    """Inverse of `RNNConfig.to_dict` (unknown keys are an error)."""
    return config_from_fields(RNNConfig, d)


def _score(cfg: RNNConfig, fk: dict) -> nn.Module | None:
    if cfg.attention == "additive":
        return AdditiveAttention(cfg.hidden, hidden=cfg.hidden, **fk)
    if cfg.attention == "general":
        return LuongAttention(cfg.hidden, **fk)
    if cfg.attention == "dot":
        return LuongAttention(**fk)
    return None


def _final_state(memory: Tensor, mask: Tensor) -> Tensor:
    """[forward output at the last real position; backward output at position 0] (B, H).

    memory (B, S, H) from a bidirectional RNN (forward half first); mask (B, 1, 1, S).
    A GRU's/LSTM's output at a position is its hidden state there, so this is the final
    hidden state of each direction.
    """
    half = memory.shape[-1] // 2
    last = (mask[:, 0, 0].sum(-1) - 1).clamp(min=0)  # (B,)
    rows = torch.arange(memory.shape[0], device=memory.device)
    return torch.cat([memory[rows, last, :half], memory[:, 0, half:]], dim=-1)  # (B, H)


class RNNSeq2Seq(nn.Module):
    """Bidirectional RNN encoder, unidirectional RNN decoder, optional attention.

    forward(src (B, S), tgt (B, T)) -> logits (B, T, V): tgt is the decoder input
    (BOS y1 ...), logits[:, t] predict the token after tgt[:, t] (teacher forcing).
    `encode` / `decode` follow the interface of `attnkit.models.decoding.greedy` and
    `beam_search`; a `KVCache` carries the decoder state between calls (the entry of
    this module holds (recurrent state, fed-back output), both batch-first, so
    `KVCache.reorder` keeps beams in step). `device`, `dtype`: of the parameters.
    """

    def __init__(
        self,
        cfg: RNNConfig,
        *,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        fk = {"device": device, "dtype": dtype}
        self.cfg = cfg
        rnn = nn.GRU if cfg.cell == "gru" else nn.LSTM
        cell = nn.GRUCell if cfg.cell == "gru" else nn.LSTMCell
        h, e = cfg.hidden, cfg.embed_dim
        self.embed = nn.Embedding(cfg.vocab, e, padding_idx=cfg.pad_id, **fk)
        self.encoder = rnn(e, h // 2, batch_first=True, bidirectional=True, **fk)
        self.bridge = nn.Linear(h, h, **fk)  # s0 = tanh(W_s final)
        self.cell = cell(e + h, h, **fk)  # input [previous token; context or fed-back output]
        self.attention = _score(cfg, fk)
        self.combine = nn.Linear(2 * h, h, **fk)  # o = tanh(W [s; c])
        self.generator = nn.Linear(h, cfg.vocab, **fk)
        self.drop = nn.Dropout(cfg.dropout) if cfg.dropout > 0 else nn.Identity()

    def _check_tokens(self, name: str, tokens: Tensor) -> None:
        if not isinstance(tokens, Tensor) or tokens.dim() != 2 or tokens.dtype.is_floating_point:
            got = tuple(tokens.shape) if isinstance(tokens, Tensor) else type(tokens).__name__
            raise ValueError(f"{name} must be integer token ids of shape (B, L), got {got}")

    def encode(self, src: Tensor) -> tuple[Tensor, Tensor]:
        """src (B, S), padded on the right -> memory (B, S', H), mask (B, 1, 1, S').

        With attention S' = S and the mask is the key-padding mask (True = may attend);
        without, the memory is the final encoder state alone (S' = 1, mask all True).
        """
        self._check_tokens("src", src)
        real = src != self.cfg.pad_id  # (B, S)
        x = self.drop(self.embed(src))  # (B, S, E)
        if src.device.type == "meta":  # shapes only: packing needs the lengths' values
            memory = self.encoder(x)[0]
        else:
            if bool((real[:, 1:] & ~real[:, :-1]).any()):
                raise ValueError("src must be padded on the right: a pad_id precedes a token")
            lengths = real.sum(1).clamp(min=1)  # an all-padding row runs over one pad token
            packed = pack_padded_sequence(x, lengths.cpu(), batch_first=True, enforce_sorted=False)
            out, _ = self.encoder(packed)
            memory, _ = pad_packed_sequence(out, batch_first=True, total_length=src.shape[1])
        mask = real[:, None, None, :]  # (B, 1, 1, S)
        if self.attention is None:
            final = _final_state(memory, mask)[:, None]  # (B, 1, H)
            return final, torch.ones_like(mask[..., :1])  # (B, 1, 1, 1)
        return memory, mask

    def _start(self, memory: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
        """Initial (recurrent state (B, 1|2, H), fed-back output (B, H)) from the memory."""
        s0 = torch.tanh(self.bridge(_final_state(memory, mask)))  # (B, H)
        state = (
            s0[:, None] if self.cfg.cell == "gru" else torch.stack([s0, torch.zeros_like(s0)], 1)
        )
        return state, torch.zeros_like(s0)

    def _run_cell(self, x: Tensor, state: Tensor) -> Tensor:
        """One cell step: x (B, E + H), state (B, 1|2, H) (LSTM: h and c) -> new state."""
        if self.cfg.cell == "gru":
            return self.cell(x, state[:, 0])[:, None]  # (B, 1, H)
        h, c = self.cell(x, (state[:, 0], state[:, 1]))
        return torch.stack([h, c], dim=1)  # (B, 2, H)

    def _step(
        self, y: Tensor, state: Tensor, fed: Tensor, memory: Tensor, mask: Tensor
    ) -> tuple[Tensor, Tensor]:
        """y (B, E) embedded previous token -> (output o (B, H), new state)."""
        kind = self.cfg.attention
        if kind == "none":
            context = memory[:, 0]  # (B, H): the final encoder state, at every step
        elif kind == "additive":  # Bahdanau: the previous state asks
            context = self.attention(state[:, :1, :], memory, mask=mask)[:, 0]  # (B, H)
        state = self._run_cell(
            torch.cat([y, fed if kind in ("dot", "general") else context], -1), state
        )
        if kind in ("dot", "general"):  # Luong: the current state asks
            context = self.attention(state[:, :1, :], memory, mask=mask)[:, 0]  # (B, H)
        out = torch.tanh(self.combine(torch.cat([state[:, 0], context], -1)))  # (B, H)
        return out, state

    def decode(
        self,
        tgt: Tensor,
        memory: Tensor,
        memory_mask: Tensor,
        *,
        cache: KVCache | None = None,
    ) -> Tensor:
        """tgt (B, N) -> logits (B, N, V), one decoder step per token.

        Without a cache (or with an empty one) the decoder starts from the encoder's final
        state; with one, it continues from the state the previous call left there.
        """
        self._check_tokens("tgt", tgt)
        entry = None if cache is None else cache.entries.get(self)
        state, fed = self._start(memory, memory_mask) if entry is None else entry
        y = self.drop(self.embed(tgt))  # (B, N, E)
        outs = []
        for t in range(tgt.shape[1]):
            fed, state = self._step(y[:, t], state, fed, memory, memory_mask)
            outs.append(fed)
        if cache is not None:
            cache.entries[self] = (state, fed)
            cache.length += tgt.shape[1]
        return self.generator(self.drop(torch.stack(outs, dim=1)))  # (B, N, V)

    def forward(self, src: Tensor, tgt: Tensor) -> Tensor:
        """src (B, S), tgt (B, T) -> logits (B, T, V)."""
        memory, mask = self.encode(src)
        return self.decode(tgt, memory, mask)

    def loss(self, src: Tensor, tgt: Tensor) -> Tensor:
        """Teacher-forced loss; tgt (B, T) = BOS y1 ... EOS PAD..., predicted from tgt[:, :-1]."""
        logits = self(src, tgt[:, :-1])  # (B, T-1, V)
        return F.cross_entropy(
            logits.flatten(0, 1),
            tgt[:, 1:].flatten(),
            ignore_index=self.cfg.pad_id,
            label_smoothing=self.cfg.label_smoothing,
        )

    @torch.no_grad()
    def alignment(self, src: Tensor, tgt: Tensor) -> Tensor:
        """Attention weights (B, T, S) of a teacher-forced pass: row t is where the step
        that reads tgt[:, t] looked. Raises ValueError for the model without attention."""
        from attnkit.viz.record import record_attention

        if self.attention is None:
            raise ValueError("alignment: an RNN without attention has no alignment weights")
        with record_attention(self) as rec:
            self(src, tgt)
        return torch.cat(rec.calls["attention"], dim=2)[:, 0]  # T maps (B, 1, 1, S) -> (B, T, S)
