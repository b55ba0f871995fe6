"""Structured masks: masks that describe themselves, so that kernels skip what is masked.

Legend: B batch, H heads, N queries, S keys; bq × bk blocks of the (N, S) score grid.

A `StructuredMask` means exactly what its `.dense()` means — a boolean (B|1, H|1, N, S) tensor,
True = may attend — but never holds one unless asked. Two forms cover what training uses:

* **Row intervals** (`RowIntervals`): query i may attend to keys lo_i <= j < hi_i. Causal,
  sliding windows, prefix-LM, packed documents whose tokens are contiguous, key padding and
  every `&` of them are of this form. A kernel reads two (B|1, N) integer arrays: the key span
  of a query block is [min lo, max hi) of its rows, everything else is skipped without a look.
* **Anything else** (`from_function`, documents whose ids are not contiguous, dense tensors,
  `|` of masks that is not an interval): evaluated block by block. `block_map` classifies each
  (query block, key block) as empty, full or partial (FlexAttention's `BlockMask` idea, without a
  compiler); kernels skip empty blocks, mask nothing in full ones and read the partial ones'
  booleans (`kernel_tiles`), so memory stays O(partial blocks · bq · bk), never O(N · S).

Positions follow attnkit's one convention: with N != S, query i sits at key position
i + (S - N) (bottom-right alignment, what decoding with a cache needs) for causal, window and
prefix masks alike.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor

from attnkit.functional._block_scan import EMPTY, FULL, PARTIAL, scan
from attnkit.functional._trace import tracing

__all__ = [
    "EMPTY",
    "FULL",
    "PARTIAL",
    "RowIntervals",
    "StructuredMask",
    "causal_intervals",
    "document",
    "document_ids",
    "from_function",
    "intervals_block",
    "prefix",
    "window",
]

_DRAW = {EMPTY: " ", PARTIAL: "░", FULL: "█"}


def _shape(t: Tensor) -> str:
    return "(" + ", ".join(str(s) for s in t.shape) + ")"


class StructuredMask:
    """A boolean mask (B|1, H|1, N, S), True = may attend, described rather than stored.

    Subclasses give `block` (the booleans of one block) and, where they can, `intervals`.
    Combine with `&` and `|` (with each other, with boolean tensors broadcastable to
    (B, H, N, S), and with `None` = no restriction).
    """

    n: int  # queries
    s: int  # keys
    batch: int = 1  # B, or 1 when every batch row has the same mask
    heads: int = 1  # H, or 1 when every head has the same mask
    device: torch.device = torch.device("cpu")

    # ------------------------------------------------------------------ what subclasses give

    def block(self, i0: int, i1: int, j0: int, j1: int) -> Tensor:
        """The mask's booleans on rows i0:i1 and keys j0:j1, shape (B|1, H|1, i1-i0, j1-j0)."""
        raise NotImplementedError

    def intervals(self) -> tuple[Tensor, Tensor] | None:
        """(lo, hi), int64 (B|1, N): row i may attend exactly keys lo_i <= j < hi_i; or None
        where the mask is not of that form. lo >= hi: the row sees nothing."""
        return None

    def describe(self) -> str:
        """A short name with the parameters, for `repr`."""
        return type(self).__name__

    # ------------------------------------------------------------------ derived

    @property
    def shape(self) -> tuple[int, int, int, int]:
        return (self.batch, self.heads, self.n, self.s)

    def dense(self, device: torch.device | str | None = None) -> Tensor:
        """The boolean tensor (B|1, H|1, N, S) this mask means: N·S booleans, for small sizes."""
        out = self.block(0, self.n, 0, self.s)
        return out if device is None else out.to(device)

    def block_map(self, block_q: int = 128, block_k: int = 128) -> Tensor:
        """int8 (B|1, H|1, ceil(N/bq), ceil(S/bk)): `EMPTY`, `PARTIAL` or `FULL` per block.

        From the intervals where there are some (O(N) work); otherwise every entry is
        evaluated once, a chunk of blocks at a time (`_block_scan.scan`)."""
        _check_blocks(block_q, block_k)
        iv = self.intervals()
        if iv is not None:
            return _interval_block_map(*iv, self.s, block_q, block_k)
        return scan(self, block_q, block_k).classes

    @property
    def density(self) -> float:
        """Fraction of (query, key) pairs that may attend, over the mask's own (B|1, H|1, N, S)."""
        total = self.batch * self.heads * self.n * self.s
        if total == 0:
            return 0.0
        iv = self.intervals()
        if iv is not None:
            lo, hi = iv
            seen = (hi - lo).clamp(min=0).sum().item() * self.heads
            return seen / total
        return scan(self, 128, 256).allowed / total

    def __repr__(self) -> str:
        return f"{self.describe()}  {self.shape}, density {self.density:.3f}\n{self.draw()}"

    def draw(self, width: int = 32) -> str:
        """The block map of batch row 0, head 0 in text: █ full, ░ partial, blank empty, with
        blocks chosen so the picture is at most `width` blocks across."""
        side = max(1, -(-max(self.n, self.s) // width))
        bq = bk = 1 << max(0, math.ceil(math.log2(side)))
        grid = self.block_map(bq, bk)[0, 0]
        lines = ["".join(_DRAW[int(c)] for c in row) for row in grid]
        return "\n".join("|" + line + "|" for line in lines) + f"\n(blocks of {bq}×{bk})"

    # ------------------------------------------------------------------ combining

    def __and__(self, other):
        other = _as_structured(other, self)
        return self if other is None else _And(self, other)

    def __or__(self, other):
        other = _as_structured(other, self)
        return self if other is None else _Or(self, other)

    __rand__ = __and__
    __ror__ = __or__

    def to(self, device: torch.device | str) -> StructuredMask:
        """The same mask with its index tensors on `device` (kernels read them there)."""
        return self


# --------------------------------------------------------------------------- row intervals


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


# --------------------------------------------------------------------------- predicates, tensors


class _Function(StructuredMask):
    def __init__(self, fn, n, s, batch, heads, device):
        self.fn, self.n, self.s = fn, n, s
        self.batch, self.heads, self.device = batch, heads, torch.device(device or "cpu")

    def block(self, i0, i1, j0, j1):
        dev = self.device
        b = torch.arange(self.batch, device=dev)[:, None, None, None]
        h = torch.arange(self.heads, device=dev)[None, :, None, None]
        q_idx = torch.arange(i0, i1, device=dev)[None, None, :, None]
        kv_idx = torch.arange(j0, j1, device=dev)[None, None, None, :]
        got = self.fn(b, h, q_idx, kv_idx)
        want = (self.batch, self.heads, i1 - i0, j1 - j0)
        if not isinstance(got, Tensor) or got.dtype != torch.bool:
            raise ValueError(
                f"{self.describe()}: fn must return a boolean tensor, got "
                f"{got.dtype if isinstance(got, Tensor) else type(got).__name__}"
            )
        tail = want[4 - got.dim() :] if got.dim() <= 4 else None  # broadcasting's alignment
        if tail is None or any(g not in (1, w) for g, w in zip(got.shape, tail, strict=True)):
            raise ValueError(
                f"{self.describe()}: fn(b, h, q_idx, kv_idx) must broadcast to the block's "
                f"(B, H, rows, keys) = {want}, got {_shape(got)}: combine the index "
                "arguments with tensor ops instead of building a tensor of fixed shape"
            )
        return got.expand(want)

    def describe(self):
        return f"from_function({getattr(self.fn, '__name__', 'fn')})"

    def to(self, device):
        return _Function(self.fn, self.n, self.s, self.batch, self.heads, device)


def from_function(
    fn: Callable[[Tensor, Tensor, Tensor, Tensor], Tensor],
    n: int,
    s: int | None = None,
    *,
    batch: int = 1,
    heads: int = 1,
    device: torch.device | str | None = None,
) -> StructuredMask:
    """A mask from a vectorised predicate ``fn(b, h, q_idx, kv_idx) -> bool tensor`` (True = may
    attend), FlexAttention's `mask_mod` idea without a compiler: the arguments are broadcastable
    index tensors (batch row, head, query, key) of one block, so ``fn`` must use tensor ops
    (``&``, ``|``, comparisons, indexing into tensors it closes over) — no Python ``if``.

    `batch`/`heads`: B or H when the mask depends on them, else 1. The predicate is evaluated
    block by block (O(block · S) memory); classifying a mask costs N · S evaluations once.
    ``fn`` must be deterministic, the same answer for the same indices: the block plan is
    worked out on first use and kept, and backends that read the plan and those that call
    ``fn`` would disagree otherwise."""
    s = n if s is None else s
    _check_sizes("from_function", n, s)
    for what, x in (("batch", batch), ("heads", heads)):
        if isinstance(x, bool) or not isinstance(x, int) or x < 1:
            raise ValueError(f"from_function: {what} must be an integer >= 1, got {x!r}")
    if not callable(fn):
        raise ValueError(f"from_function: fn must be callable, got {type(fn).__name__}")
    return _Function(fn, n, s, batch, heads, device)


class _Dense(StructuredMask):
    """A boolean tensor broadcastable to (B, H, N, S), combined with descriptions."""

    def __init__(self, t: Tensor, n: int, s: int):
        t = t[(None,) * (4 - t.dim())]
        if t.dim() != 4 or t.shape[2] not in (1, n) or t.shape[3] not in (1, s):
            want = f"(B, H, N={n}, S={s})"
            raise ValueError(f"mask of shape {_shape(t)} does not broadcast to {want}")
        self.t, self.n, self.s = t, n, s
        self.batch, self.heads, self.device = t.shape[0], t.shape[1], t.device

    def block(self, i0, i1, j0, j1):
        t = self.t[:, :, i0:i1] if self.t.shape[2] != 1 else self.t
        t = t[..., j0:j1] if self.t.shape[3] != 1 else t
        return t.expand(self.batch, self.heads, i1 - i0, j1 - j0)

    def describe(self):
        return f"tensor{_shape(self.t)}"

    def to(self, device):
        return _Dense(self.t.to(device), self.n, self.s)


# --------------------------------------------------------------------------- & and |


class _Combined(StructuredMask):
    def __init__(self, a: StructuredMask, b: StructuredMask):
        if (a.n, a.s) != (b.n, b.s):
            raise ValueError(f"cannot combine masks of (N, S) = ({a.n}, {a.s}) and ({b.n}, {b.s})")
        for what in ("batch", "heads"):
            x, y = getattr(a, what), getattr(b, what)
            if x != y and 1 not in (x, y):
                raise ValueError(f"cannot combine masks with {what} {x} and {y}")
        self.parts = (a, b)
        self.n, self.s, self.device = a.n, a.s, a.device
        self.batch, self.heads = max(a.batch, b.batch), max(a.heads, b.heads)

    def to(self, device):
        return type(self)(*(p.to(device) for p in self.parts))


class _And(_Combined):
    op = "&"

    def block(self, i0, i1, j0, j1):
        a, b = self.parts
        return a.block(i0, i1, j0, j1) & b.block(i0, i1, j0, j1)

    def intervals(self):
        ia, ib = (p.intervals() for p in self.parts)
        if ia is None or ib is None:
            return None
        return torch.maximum(ia[0], ib[0]), torch.minimum(ia[1], ib[1])

    def describe(self):
        return " & ".join(_paren(p) for p in self.parts)

    def factors(self) -> list[StructuredMask]:
        """The masks this is the AND of, nested ANDs flattened."""
        return [f for p in self.parts for f in (p.factors() if isinstance(p, _And) else [p])]


class _Or(_Combined):
    op = "|"

    def block(self, i0, i1, j0, j1):
        a, b = self.parts
        return a.block(i0, i1, j0, j1) | b.block(i0, i1, j0, j1)

    def intervals(self):
        ia, ib = (p.intervals() for p in self.parts)
        if ia is None or ib is None:
            return None
        lo1, hi1, lo2, hi2 = torch.broadcast_tensors(*ia, *ib)
        e1, e2 = lo1 >= hi1, lo2 >= hi2  # empty rows add nothing to a union
        if not bool((e1 | e2 | (torch.maximum(lo1, lo2) <= torch.minimum(hi1, hi2))).all()):
            return None  # a row would see two separate runs of keys
        lo = torch.where(e1, lo2, torch.where(e2, lo1, torch.minimum(lo1, lo2)))
        hi = torch.where(e1, hi2, torch.where(e2, hi1, torch.maximum(hi1, hi2)))
        return lo, hi

    def describe(self):
        return " | ".join(_paren(p) for p in self.parts)


def _paren(m: StructuredMask) -> str:
    return f"({m.describe()})" if isinstance(m, _Combined) else m.describe()


def _as_structured(other, like: StructuredMask) -> StructuredMask | None:
    if other is None or isinstance(other, StructuredMask):
        return other
    if isinstance(other, Tensor) and other.dtype == torch.bool:
        return _Dense(other, like.n, like.s)
    got = f"{other.dtype} {_shape(other)}" if isinstance(other, Tensor) else type(other).__name__
    raise ValueError(f"a structured mask combines with masks and boolean tensors, got {got}")


# --------------------------------------------------------------------------- block classes


def _check_sizes(name: str, n, s) -> None:
    for what, x in (("n", n), ("s", s)):
        if isinstance(x, bool) or not isinstance(x, int) or x < 0:
            raise ValueError(f"{name}: {what} must be an integer >= 0, got {x!r}")


def _is_integer(t: Tensor) -> bool:
    """An integer dtype: not floating, complex or boolean."""
    return not (t.dtype.is_floating_point or t.dtype.is_complex or t.dtype == torch.bool)


def _check_blocks(bq, bk) -> None:
    for what, x in (("block_q", bq), ("block_k", bk)):
        if isinstance(x, bool) or not isinstance(x, int) or x < 1:
            raise ValueError(f"block_map: {what} must be an integer >= 1, got {x!r}")


def _interval_block_map(lo: Tensor, hi: Tensor, s: int, bq: int, bk: int) -> Tensor:
    """Block classes from row intervals: a block is full when every row covers its keys,
    empty when no row reaches into them. (B|1, 1, nqb, nkb) int8."""
    b, n = lo.shape
    nqb, nkb = -(-n // bq), -(-s // bk)
    pad = nqb * bq - n
    seen = lo < hi
    # rows that see nothing neither widen a block's span nor let a block count as covered
    lo_any, hi_any = torch.where(seen, lo, s), torch.where(seen, hi, 0)
    hi_all = torch.where(seen, hi, -1)

    def fold(x, fill, op):  # (B, N) -> (B, nqb), reduced over each block's rows
        x = torch.nn.functional.pad(x, (0, pad), value=fill).view(b, nqb, bq)
        return op(x, dim=2).values

    min_lo, max_hi = fold(lo_any, s, torch.min), fold(hi_any, 0, torch.max)
    max_lo, min_hi = fold(lo_any, -1, torch.max), fold(hi_all, s + 1, torch.min)
    j0 = torch.arange(nkb, device=lo.device) * bk  # (nkb,)
    j1 = (j0 + bk).clamp(max=s)
    touches = (min_lo[..., None] < j1) & (max_hi[..., None] > j0)
    covers = (max_lo[..., None] <= j0) & (min_hi[..., None] >= j1)
    out = torch.where(covers, FULL, torch.where(touches, PARTIAL, EMPTY)).to(torch.int8)
    return out[:, None]  # (B|1, 1, nqb, nkb)
