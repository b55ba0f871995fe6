"""The Universal Transformer (Dehghani et al. 2019): one encoder block and one decoder block,
each applied T times with a per-step signal, optionally with adaptive computation time.

Dimensions: B batch, S source length, T target length, N positions (S or T), C model width,
V vocabulary, K recurrence steps taken.

Step t = 1..T adds the coordinate embedding of §2.1 to every position i before the block:

    P[t, i, 2j]   = sin(i / 10000^(2j/C)) + sin(t / 10000^(2j/C))
    P[t, i, 2j+1] = cos(i / 10000^(2j/C)) + cos(t / 10000^(2j/C))

Adaptive computation time (Graves 2016, §2; the UT's §2.2): after each step k a halting unit
gives every position h_k = sigmoid(w · state_k + b). A position halts at the first step N
where h_1 + ... + h_N > 1 - ε, or at the last allowed step; its weights are p_k = h_k for
k < N and the remainder R = 1 - (h_1 + ... + h_(N-1)) at N, so they sum to 1, and its output
is Σ_k p_k · state_k. Its ponder cost is ρ = N + R; `UniversalOutput.ponder_cost` is the mean ρ
over real positions of encoder and decoder, which the trainer adds to the loss times
`ponder_weight` (τ). As in the UT's implementation, halted positions keep being transformed
while others run (they stay keys and values), but their output no longer changes; so a
position's output depends only on the positions it attends to, and cached (prefix)
decoding gives the teacher-forced result.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnkit.functional.positional import sinusoidal
from attnkit.models.checkpoint import config_from_fields
from attnkit.models.decoding import KVCache
from attnkit.models.transformer import (
    DecoderBlock,
    TokenTable,
    TransformerConfig,
    _TiedModule,
    pad_mask,
)
from attnkit.modules._checks import positive_int, probability
from attnkit.modules.blocks import EncoderBlock

__all__ = [
    "ACTOutput",
    "UniversalConfig",
    "UniversalOutput",
    "UniversalTransformer",
    "adaptive_computation",
    "coordinate_signal",
    "universal_config_from_dict",
]


@dataclass(frozen=True)
class UniversalConfig:
    """Hyper-parameters of `UniversalTransformer` (one vocabulary for source and target)."""

    vocab: int  # vocabulary size V
    d_model: int = 64  # model width C
    num_heads: int = 4  # attention heads
    d_ff: int = 256  # transition (feed-forward) width
    steps: int = 4  # recurrence steps T; with ACT the most a position may take
    act: bool = False  # adaptive computation time
    act_threshold: float = 0.99  # 1 - ε: halt once the halting probabilities pass it
    act_bias: float = 1.0  # initial bias of the halting unit (the UT code's default)
    ponder_weight: float = 0.01  # τ, weight of the ponder cost in the loss
    dropout: float = 0.0  # on embeddings and every sublayer output
    attn_dropout: float = 0.0  # on attention probabilities
    norm_first: bool = True  # pre-norm (True, with a final LayerNorm) or post-norm (the paper)
    label_smoothing: float = 0.0  # of the training loss
    max_len: int = 256  # longest sequence the signal covers
    pad_id: int = 0  # padding token: masked as a key, ignored by the loss

    def __post_init__(self) -> None:
        for name in ("vocab", "d_model", "num_heads", "d_ff", "steps", "max_len"):
            positive_int(name, getattr(self, name))
        for name in ("dropout", "attn_dropout", "label_smoothing"):
            probability(name, getattr(self, name))
        if self.d_model % self.num_heads:
            raise ValueError(
                f"d_model={self.d_model} must be divisible by num_heads={self.num_heads}"
            )
        if not 0 < self.act_threshold <= 1:
            raise ValueError(f"act_threshold must be in (0, 1], got {self.act_threshold}")
        if not self.ponder_weight >= 0:
            raise ValueError(f"ponder_weight must be >= 0, got {self.ponder_weight}")
        if not 0 <= self.pad_id < self.vocab:
            raise ValueError(f"pad_id must be a token id, got {self.pad_id} for vocab {self.vocab}")

    def to_dict(self) -> dict:
        return asdict(self)


def universal_config_from_dict(d: dict) -> UniversalConfig:
    """Inverse of `UniversalConfig.to_dict` (unknown keys are an error)."""
    return config_from_fields(UniversalConfig, d)


def coordinate_signal(step: int, n: int, dim: int, *, dtype=None, device=None) -> Tensor:
    """The UT's per-step signal (N, C): position sinusoid of 0..N-1 + time sinusoid of `step`."""
    pos = sinusoidal(n, dim, dtype=torch.float64, device=device)  # (N, C)
    time = sinusoidal(1, dim, offset=step, dtype=torch.float64, device=device)  # (1, C)
    return (pos + time).to(dtype or torch.get_default_dtype())


class ACTOutput(NamedTuple):
    """What `adaptive_computation` returns."""

    state: Tensor  # (B, N, C): Σ_k p_k · state_k
    weights: Tensor  # (B, N, K): p_k of each position (0 after it halted, 0 for padding)
    ponder: Tensor  # (B, N): ρ = N + R (0 for padding)
    halt_step: Tensor  # (B, N): the step N at which each position halted (1-based; 0 padding)


def adaptive_computation(
    transition: Callable[[Tensor, int], Tensor],
    halting: Callable[[Tensor], Tensor],
    x: Tensor,
    valid: Tensor,
    *,
    max_steps: int,
    threshold: float,
) -> ACTOutput:
    """Graves' ACT over positions: `state_k = transition(state_(k-1), k)` for k = 1.. until
    every valid position halted or k = max_steps.

    x (B, N, C) the initial state; valid (B, N) bool, True = a real position (padding takes no
    weight and no ponder cost); halting(state (B, N, C)) -> probabilities h (B, N) in [0, 1].
    """
    max_steps = positive_int("max_steps", max_steps)
    if valid.shape != x.shape[:2] or valid.dtype != torch.bool:
        raise ValueError(
            f"valid must be bool (B, N) = {tuple(x.shape[:2])}, got {tuple(valid.shape)}"
        )
    total = x.new_zeros(x.shape[:2])  # (B, N): Σ h_k of the steps before halting
    ponder = x.new_zeros(x.shape[:2])
    halt_step = torch.zeros(x.shape[:2], dtype=torch.long, device=x.device)
    running = valid.clone()
    out = torch.zeros_like(x)
    weights, state = [], x
    for k in range(1, max_steps + 1):
        state = transition(state, k)  # (B, N, C)
        h = halting(state)  # (B, N)
        halts = running & ((total + h > threshold) | (k == max_steps))
        still = running & ~halts
        remainder = (1 - total) * halts  # R, at the halting step only
        w = h * still + remainder  # (B, N)
        out = out + w[..., None] * state
        ponder = torch.where(halts, k + remainder, ponder)  # ρ = N + R, set when halting
        total = total + h * still
        halt_step = torch.where(halts, torch.full_like(halt_step, k), halt_step)
        weights.append(w)
        running = still
        if not bool(running.any()):
            break
    return ACTOutput(out, torch.stack(weights, dim=-1), ponder, halt_step)


class UniversalOutput(NamedTuple):
    """`UniversalTransformer.forward`'s result."""

    logits: Tensor  # (B, T, V)
    ponder_cost: Tensor  # () mean ρ over real source and target positions (0 without ACT)


class _HaltingUnit(nn.Linear):
    """h = sigmoid(w · state + b) is taken by the caller; b starts at `bias_init` (Graves
    2016, §2: a positive bias makes early halting likely, short ponder at the start)."""

    def __init__(self, dim: int, bias_init: float, **fk) -> None:
        self.bias_init = bias_init
        super().__init__(dim, 1, **fk)

    def reset_parameters(self) -> None:
        super().reset_parameters()
        nn.init.constant_(self.bias, self.bias_init)


class UniversalTransformer(_TiedModule):
    """Encoder-decoder Universal Transformer with one shared block per side.

    forward(src (B, S), tgt (B, T)) -> UniversalOutput(logits (B, T, V), ponder_cost ()).
    `encode` / `decode` follow `attnkit.models.decoding.greedy` and `beam_search`. Blocks
    reuse attnkit's `EncoderBlock` and `DecoderBlock`, so `record_attention` records one map
    per step of the shared block. A `KVCache` keeps the decoded prefix (one shared block
    applied several times has no single key/value entry), and `decode` recomputes it.
    `device`, `dtype`: of the parameters.
    """

    def __init__(
        self,
        cfg: UniversalConfig,
        *,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        fk = {"device": device, "dtype": dtype}
        self.cfg = cfg
        block_cfg = TransformerConfig(
            src_vocab=cfg.vocab,
            tgt_vocab=cfg.vocab,
            d_model=cfg.d_model,
            num_heads=cfg.num_heads,
            d_ff=cfg.d_ff,
            dropout=cfg.dropout,
            attn_dropout=cfg.attn_dropout,
            norm_first=cfg.norm_first,
            pad_id=cfg.pad_id,
        )
        self.table = TokenTable(cfg.vocab, cfg.d_model, **fk)  # N(0, 1/C); ·√C: unit variance
        self.encoder = EncoderBlock(
            cfg.d_model,
            cfg.num_heads,
            cfg.d_ff,
            norm_first=cfg.norm_first,
            dropout=cfg.dropout,
            attn_dropout=cfg.attn_dropout,
            activation="relu",
            **fk,
        )
        self.decoder = DecoderBlock(block_cfg, **fk)
        norm = lambda: nn.LayerNorm(cfg.d_model, **fk) if cfg.norm_first else nn.Identity()  # noqa: E731
        self.encoder_norm, self.decoder_norm = norm(), norm()
        # One halting unit per side (Graves: a sigmoid unit on the state): unused without
        # ACT, but always built, so that checkpoints of both modes share their names.
        self.encoder_halt = _HaltingUnit(cfg.d_model, cfg.act_bias, **fk)
        self.decoder_halt = _HaltingUnit(cfg.d_model, cfg.act_bias, **fk)
        self.generator = nn.Linear(cfg.d_model, cfg.vocab, bias=False, **fk)
        self._retie()  # tied, as the Transformer of attnkit.seq2seq
        self.drop = nn.Dropout(cfg.dropout) if cfg.dropout > 0 else nn.Identity()

    def _retie(self) -> None:
        self.generator.weight = self.table.weight

    def _embed(self, tokens: Tensor) -> Tensor:
        if tokens.dim() != 2 or tokens.dtype.is_floating_point:
            raise ValueError(
                f"tokens must be integer ids of shape (B, N), got {tuple(tokens.shape)}"
            )
        if tokens.shape[1] > self.cfg.max_len:
            raise ValueError(
                f"sequence of {tokens.shape[1]} tokens: at most max_len={self.cfg.max_len}"
            )
        return self.drop(self.table(tokens) * self.cfg.d_model**0.5)  # (B, N, C)

    def _recur(
        self, block: Callable[[Tensor], Tensor], halt: nn.Linear, x: Tensor, valid: Tensor
    ) -> ACTOutput:
        """T steps of `block` with the coordinate signal, or ACT over at most T steps."""
        n, c = x.shape[1], x.shape[2]

        def transition(state: Tensor, k: int) -> Tensor:
            signal = coordinate_signal(k, n, c, dtype=state.dtype, device=state.device)  # (N, C)
            return block(state + signal)

        if self.cfg.act:
            probs = lambda s: torch.sigmoid(halt(s))[..., 0]  # noqa: E731  (B, N)
            return adaptive_computation(
                transition,
                probs,
                x,
                valid,
                max_steps=self.cfg.steps,
                threshold=self.cfg.act_threshold,
            )
        for k in range(1, self.cfg.steps + 1):
            x = transition(x, k)
        zero = x.new_zeros(x.shape[:2])
        return ACTOutput(x, zero[..., None], zero, torch.zeros_like(valid, dtype=torch.long))

    def _encode(self, src: Tensor) -> tuple[Tensor, Tensor, ACTOutput]:
        mask = pad_mask(src, self.cfg.pad_id)  # (B, 1, 1, S)
        act = self._recur(
            lambda x: self.encoder(x, mask=mask), self.encoder_halt, self._embed(src), mask[:, 0, 0]
        )
        return self.encoder_norm(act.state), mask, act

    def encode(self, src: Tensor) -> tuple[Tensor, Tensor]:
        """src (B, S) -> memory (B, S, C) and its padding mask (B, 1, 1, S), True = may attend."""
        memory, mask, _ = self._encode(src)
        return memory, mask

    def _decode(self, tgt: Tensor, memory: Tensor, memory_mask: Tensor) -> tuple[Tensor, ACTOutput]:
        mask = pad_mask(tgt, self.cfg.pad_id)  # (B, 1, 1, T)

        def block(x: Tensor) -> Tensor:
            return self.decoder(x, memory, mask=mask, memory_mask=memory_mask)

        act = self._recur(block, self.decoder_halt, self._embed(tgt), mask[:, 0, 0])
        return self.generator(self.decoder_norm(act.state)), act

    def decode(
        self, tgt: Tensor, memory: Tensor, memory_mask: Tensor, *, cache: KVCache | None = None
    ) -> Tensor:
        """tgt (B, N) -> logits (B, N, V). With a cache, tgt holds the N new tokens: the
        prefix kept in the cache is extended and the decoder recomputed over it."""
        if cache is None:
            return self._decode(tgt, memory, memory_mask)[0]
        entry = cache.entries.get(self)
        prefix = tgt if entry is None else torch.cat([entry[0], tgt], dim=1)  # (B, T)
        cache.entries[self] = (prefix, prefix)  # reorder() selects batch rows of both
        cache.length += tgt.shape[1]
        return self._decode(prefix, memory, memory_mask)[0][:, -tgt.shape[1] :]

    def forward(self, src: Tensor, tgt: Tensor) -> UniversalOutput:
        """src (B, S), tgt (B, T) -> UniversalOutput(logits (B, T, V), ponder_cost ())."""
        memory, memory_mask, enc = self._encode(src)
        logits, dec = self._decode(tgt, memory, memory_mask)
        ponder = _mean_over_real(enc.ponder, src != self.cfg.pad_id)
        ponder = ponder + _mean_over_real(dec.ponder, tgt != self.cfg.pad_id)
        return UniversalOutput(logits, ponder)

    def act_trace(self, src: Tensor, tgt: Tensor) -> tuple[ACTOutput, ACTOutput]:
        """The encoder's and the decoder's `ACTOutput` of a teacher-forced pass (for plots
        and tests of the halting weights; zeros without ACT)."""
        memory, memory_mask, enc = self._encode(src)
        return enc, self._decode(tgt, memory, memory_mask)[1]

    def loss(self, src: Tensor, tgt: Tensor) -> Tensor:
        """Teacher-forced cross-entropy + τ·ponder cost; tgt (B, T) = BOS y1 ... EOS PAD..."""
        logits, ponder = self(src, tgt[:, :-1])
        ce = F.cross_entropy(
            logits.flatten(0, 1),
            tgt[:, 1:].flatten(),
            ignore_index=self.cfg.pad_id,
            label_smoothing=self.cfg.label_smoothing,
        )
        return ce + self.cfg.ponder_weight * ponder


def _mean_over_real(values: Tensor, real: Tensor) -> Tensor:
    return (values * real).sum() / real.sum().clamp(min=1)
