"""The structured mask's base class, boolean tensors as masks, and their `&` / `|`.

Legend: B batch, H heads, N queries, S keys; bq × bk blocks of the (N, S) score grid.

What a `StructuredMask` is and which forms there are: `attnkit.functional.structured`.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from attnkit.functional._block_scan import EMPTY, FULL, PARTIAL, scan
from attnkit.functional._runs import MAX_RUNS, block_classes, intersect_runs, union_runs

__all__ = ["StructuredMask"]

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

    def key_runs(self) -> tuple[Tensor, Tensor] | None:
        """(lo, hi), int64 (K, B|1, N): row i may attend exactly the keys of its K runs
        lo_ki <= j < hi_ki, sorted, disjoint, empty runs last (`_runs`); or None where the mask
        is not of that form (or needs more than `_runs.MAX_RUNS` runs in some row)."""
        iv = self.intervals()
        return None if iv is None else (iv[0][None], iv[1][None])

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

        From the row intervals or runs where there are some (O(K·N) work, `_runs.block_classes`);
        otherwise every entry is evaluated once, a chunk of blocks at a time
        (`_block_scan.scan`)."""
        _check_blocks(block_q, block_k)
        rs = self.key_runs()
        if rs is not None:
            return block_classes(*rs, self.s, block_q, block_k)
        return scan(self, block_q, block_k).classes

    @property
    def density(self) -> float:
        """Fraction of (query, key) pairs that may attend, over the mask's own (B|1, H|1, N, S)."""
        total = self.batch * self.heads * self.n * self.s
        if total == 0:
            return 0.0
        rs = self.key_runs()
        if rs is not None:  # runs are disjoint: no key counted twice
            lo, hi = rs
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

    def key_runs(self):
        ra, rb = (p.key_runs() for p in self.parts)
        if ra is None or rb is None:
            return None
        out = intersect_runs(ra, rb)
        return out if out[0].shape[0] <= MAX_RUNS else None

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
        rs = self.key_runs()  # one run per row: an interval
        return None if rs is None or rs[0].shape[0] != 1 else (rs[0][0], rs[1][0])

    def key_runs(self):
        ra, rb = (p.key_runs() for p in self.parts)
        if ra is None or rb is None:
            return None
        out = union_runs(ra, rb)
        return out if out[0].shape[0] <= MAX_RUNS else None  # more: the tile table

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
