"""Masks of row intervals: query i may attend keys lo_i <= j < hi_i (causal, windows,
prefix-LM, packed documents), and documents whose ids are not contiguous.

Legend: B batch, H heads, N queries, S keys.

Positions follow attnkit's one convention: with N != S, query i sits at key position
i + (S - N) (bottom-right alignment, what decoding with a cache needs).
"""

from __future__ import annotations

import torch
from torch import Tensor

from attnkit.functional._mask_base import StructuredMask, _check_sizes, _is_integer, _shape
from attnkit.functional._runs import merge_runs, runs_block
from attnkit.functional._trace import tracing

__all__ = [
    "RowIntervals",
    "RowRuns",
    "causal_intervals",
    "document",
    "document_ids",
    "intervals_block",
    "prefix",
    "window",
]


class RowIntervals(StructuredMask):
    """Query i may attend keys lo_i <= j < hi_i. lo, hi: int64 (B|1, N), clamped to [0, S]."""

    def __init__(self, lo: Tensor, hi: Tensor, s: int, name: str = "intervals"):
        lo, hi = torch.broadcast_tensors(lo.long(), hi.long())
        if lo.dim() == 1:
            lo, hi = lo[None], hi[None]
        if lo.dim() != 2:
            raise ValueError(f"{name}: row bounds must be (N,) or (B, N), got {_shape(lo)}")
        self.lo, self.hi = lo.clamp(0, s), hi.clamp(0, s)
        self.n, self.s, self.batch = lo.shape[1], s, lo.shape[0]
        self.device = lo.device
        self.name = name

    def intervals(self) -> tuple[Tensor, Tensor]:
        return self.lo, self.hi

    def block(self, i0, i1, j0, j1):
        return intervals_block(self.lo, self.hi, i0, i1, j0, j1)

    def describe(self):
        return self.name

    def to(self, device):
        return RowIntervals(self.lo.to(device), self.hi.to(device), self.s, self.name)


class RowRuns(StructuredMask):
    """Query i may attend the keys of its runs lo_ki <= j < hi_ki. lo, hi: int64 (K, B|1, N),
    clamped to [0, S] and merged (`_runs.merge_runs`): what a crop of runs at other keys is."""

    def __init__(self, lo: Tensor, hi: Tensor, s: int, name: str = "runs"):
        lo, hi = torch.broadcast_tensors(lo.long().clamp(0, s), hi.long().clamp(0, s))
        self.lo, self.hi = merge_runs(lo, hi)
        self.n, self.s, self.batch = lo.shape[2], s, lo.shape[1]
        self.device = lo.device
        self.name = name

    def key_runs(self) -> tuple[Tensor, Tensor]:
        return self.lo, self.hi

    def intervals(self) -> tuple[Tensor, Tensor] | None:
        return (self.lo[0], self.hi[0]) if self.lo.shape[0] == 1 else None

    def block(self, i0, i1, j0, j1):
        return runs_block(self.lo, self.hi, i0, i1, j0, j1)

    def describe(self):
        return self.name

    def to(self, device):
        return RowRuns(self.lo.to(device), self.hi.to(device), self.s, self.name)


def intervals_block(lo: Tensor, hi: Tensor, i0: int, i1: int, j0: int, j1: int) -> Tensor:
    """Row intervals lo, hi (B|1, N) on rows i0:i1 and keys j0:j1 as booleans
    (B|1, 1, nq, nk): key j is allowed for row i iff lo_i <= j < hi_i."""
    keys = torch.arange(j0, j1, device=lo.device)  # (nk,)
    lo, hi = lo[:, i0:i1, None], hi[:, i0:i1, None]  # (B|1, nq, 1)
    return ((keys >= lo) & (keys < hi))[:, None]  # (B|1, 1, nq, nk)


def _positions(n: int, s: int, device) -> Tensor:
    """Key position of each query, bottom-right aligned: i + (S - N), shape (N,)."""
    return torch.arange(n, device=device) + (s - n)


def causal_intervals(n: int, s: int | None = None, *, device=None) -> RowIntervals:
    """Causal as row intervals: query i sees keys j <= i + (S - N)."""
    s = n if s is None else s
    _check_sizes("causal", n, s)
    pos = _positions(n, s, device)
    return RowIntervals(torch.zeros_like(pos), pos + 1, s, "causal")


def window(
    n: int, window: int, s: int | None = None, *, causal: bool = False, device=None
) -> RowIntervals:
    """Sliding window: query i (at key position p = i + S - N) sees keys with |j - p| < window,
    or with `causal` the `window` keys p - window < j <= p (Mistral's, Gemma's local layers).

    The same alignment as `attnkit.masks.sliding_window`, without the (N, S) tensor."""
    s = n if s is None else s
    _check_sizes("window", n, s)
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise ValueError(f"window: window must be an integer >= 1, got {window!r}")
    name = f"window({window}{', causal' if causal else ''})"
    # wider than N + S sees every key it can: held as N + S + 1, so that position ± window
    # stays inside int64 (2**63 - 1 wrapped around and emptied rows, issue 39)
    window = min(window, n + s + 1)
    pos = _positions(n, s, device)
    hi = pos + 1 if causal else pos + window
    return RowIntervals(pos - window + 1, hi, s, name)


def prefix(n: int, prefix_len: int | Tensor, s: int | None = None, *, device=None) -> RowIntervals:
    """Prefix-LM (T5, PaLM, UniLM): keys before `prefix_len` are seen by every query, the
    rest causally — query i (at key position p = i + S - N) sees j < max(prefix_len, p + 1).

    `prefix_len`: an int, or an integer tensor (B,) of per-row prefix lengths."""
    s = n if s is None else s
    _check_sizes("prefix", n, s)
    pos = _positions(n, s, device)  # (N,)
    if isinstance(prefix_len, Tensor):
        if prefix_len.dim() != 1 or prefix_len.dtype.is_floating_point:
            raise ValueError(
                f"prefix: prefix_len must be an int or an integer tensor (B,), got "
                f"{prefix_len.dtype} {_shape(prefix_len)}"
            )
        bound = prefix_len.to(pos.device).long()[:, None]  # (B, 1)
    elif isinstance(prefix_len, int) and not isinstance(prefix_len, bool) and prefix_len >= 0:
        bound = torch.tensor(min(prefix_len, s), device=pos.device)  # past S: every key, in int64
    else:
        raise ValueError(
            f"prefix: prefix_len must be an int >= 0 or a (B,) tensor, got {prefix_len!r}"
        )
    hi = torch.maximum(bound, pos + 1)  # (B|1, N) or (N,)
    return RowIntervals(torch.zeros_like(hi), hi, s, "prefix")


def document_ids(lengths: Tensor | list[int], total: int | None = None) -> Tensor:
    """Document ids (N,) of a packed sequence from its documents' lengths (flash-attn's
    `cu_seqlens` habit): lengths [3, 2] -> ids [0, 0, 0, 1, 1]. With `total` > sum(lengths)
    the tail (padding) gets its own id, len(lengths)."""
    if not isinstance(lengths, Tensor) and len(lengths) == 0:
        lengths = torch.zeros(0, dtype=torch.long)  # as_tensor([]) would be float32
    lengths = torch.as_tensor(lengths)
    if lengths.dim() != 1 or not _is_integer(lengths):
        raise ValueError(
            f"document_ids: lengths must be integers (D,), got {lengths.dtype} {_shape(lengths)}"
        )
    if lengths.numel() and int(lengths.min()) < 0:
        raise ValueError(f"document_ids: lengths must be >= 0, got {lengths.tolist()}")
    used = int(lengths.sum())
    total = used if total is None else total
    if isinstance(total, bool) or not isinstance(total, int):
        raise ValueError(f"document_ids: total must be an integer, got {total!r}")
    if total < used:
        raise ValueError(f"document_ids: total={total} is less than sum(lengths)={used}")
    lengths = lengths.long()  # repeat_interleave takes int32/int64 only
    ids = torch.repeat_interleave(torch.arange(lengths.numel(), device=lengths.device), lengths)
    tail = torch.full((total - used,), lengths.numel(), dtype=ids.dtype, device=ids.device)
    return torch.cat([ids, tail])


def document(ids: Tensor, *, causal: bool = False) -> StructuredMask:
    """Packed documents: query i sees key j iff ids[i] == ids[j] (and, with `causal`, j <= i).

    `ids`: integer document ids (N,) or (B, N) of a packed sequence (`document_ids` makes them
    from lengths). Where every document's tokens are contiguous (the packing habit), the mask
    is a row-interval mask and kernels visit only each document's own keys; otherwise it is
    evaluated block by block."""
    if not isinstance(ids, Tensor) or ids.dim() not in (1, 2) or not _is_integer(ids):
        got = f"{ids.dtype} {_shape(ids)}" if isinstance(ids, Tensor) else type(ids).__name__
        raise ValueError(f"document: ids must be an integer tensor (N,) or (B, N), got {got}")
    ids2 = ids[None] if ids.dim() == 1 else ids  # (B|1, N)
    n = ids2.shape[1]
    name = f"document({'causal' if causal else 'bidirectional'})"
    if tracing():  # the contiguity check reads data; traced code runs `.dense()` anyway
        return _SameId(ids2, causal, name)
    starts = torch.ones_like(ids2, dtype=torch.bool)
    starts[:, 1:] = ids2[:, 1:] != ids2[:, :-1]  # (B|1, N): a new run starts here
    runs = starts.sum(1)  # runs per batch row
    distinct = torch.tensor([int(torch.unique(row).numel()) for row in ids2]) if n else runs
    if n and not torch.equal(runs.cpu(), distinct):
        return _SameId(ids2, causal, name)
    pos = torch.arange(n, device=ids.device).expand_as(ids2)  # (B|1, N)
    ends = torch.roll(starts, -1, dims=1)
    ends[:, -1:] = True  # (B|1, N): the last token of a run
    lo = torch.where(starts, pos, 0).cummax(1).values  # start of each token's run
    hi = torch.where(ends, pos + 1, n).flip(1).cummin(1).values.flip(1)  # end of its run
    if causal:
        hi = torch.minimum(hi, pos + 1)
    return RowIntervals(lo, hi, n, name)


class _SameId(StructuredMask):
    """Documents whose tokens are not contiguous: ids[i] == ids[j], evaluated per block."""

    def __init__(self, ids: Tensor, causal: bool, name: str):
        self.ids, self.causal, self.name = ids, causal, name
        self.n = self.s = ids.shape[1]
        self.batch, self.device = ids.shape[0], ids.device

    def block(self, i0, i1, j0, j1):
        same = self.ids[:, i0:i1, None] == self.ids[:, None, j0:j1]  # (B|1, nq, nk)
        if self.causal:
            rows = torch.arange(i0, i1, device=self.device)[:, None]
            same = same & (torch.arange(j0, j1, device=self.device) <= rows)
        return same[:, None]

    def describe(self):
        return self.name + " (ids not contiguous)"

    def to(self, device):
        return _SameId(self.ids.to(device), self.causal, self.name)
