"""Masks that skip well in another order of the tokens: dilated windows, strided (video
"temporal") masks, 2-D neighbourhoods, and any predicate given an order.

Legend: B batch, H heads, N queries = S keys (self-attention); a permutation `order` (N,) puts
token order[a] at position a.

In token order these masks touch nearly every block (a dilation-4 window sees one key in four,
a strided mask one token per frame), so a blocked kernel computes and then masks most of what
it reads. Reordered, they are block-sparse: sorting tokens by their residue makes a dilated
window a band within each residue class and a strided mask a set of contiguous documents (row
intervals, skipped exactly), and tiles of the image (8 × 8, 4 × 4 for small kernels) make a 2-D
neighbourhood a few dense blocks per query block. The chunked backend (eager, no bias, no
dropout) gathers q, k, v into that order, attends with the reordered mask, and scatters out and
lse back: the results are those of the mask in token order (autograd carries the gathers); on
the compiled kernel only k and v are gathered, the kernel reading and writing the query-side
rows through the order (`Args::qrows`).
Where the residue classes are of equal size (the dilation or stride divides N) no gather is
needed: token t·g + r is position t of class r, so (B, H, N, D) is (B, H, N/g, g, D), and the
classes are g independent sequences of N/g tokens, each a window (or full, or causal) over its
class: one call, which the compiled kernel reads in place (`chunked_attention(groups=g)`).
Everywhere else (bias, dropout, other backends, `&`/`|` with other masks, `.dense()`) the mask
is its token-order predicate, exact and without the speed-up. Dilated windows follow the
attention-gym/DiNAT convention, strided masks Sparse Transformer's / video models' "same
position in every frame", neighbourhoods NATTEN's (windows clamped at the borders, so every
query sees kernel² keys; Hassani et al. 2023).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import NamedTuple

import torch
from torch import Tensor

from attnkit.functional._huge_pages import empty_hinted
from attnkit.functional._natten_tiles import choose_tile, tile_order
from attnkit.functional.structured import RowIntervals, StructuredMask, _Function
from attnkit.functional.structured import window as _window

__all__ = ["Reordered", "dilated_window", "neighborhood_2d", "reorder", "strided"]


class Groups(NamedTuple):
    """Tokens r, r + g, r + 2g, ... (g = `count`, dividing N) are a sequence of their own, in
    which position t sees position u when |t - u| < `window` (with `causal`, 0 <= t - u <
    `window`); no token sees another sequence's."""

    count: int
    window: int
    causal: bool


class Reordered(_Function):
    """A predicate mask (token order) with the same mask in a cheaper order: `inner(a, c)` ==
    `fn(order[a], order[c])`. Means exactly its token-order predicate. `groups`: the same mask
    as independent interleaved sequences (`Groups`), where it is one."""

    def __init__(
        self, fn, n, order: Tensor, inner: StructuredMask | None, name: str, device=None,
        groups: Groups | None = None, natural: StructuredMask | None = None,
    ):  # fmt: skip
        super().__init__(fn, n, n, 1, 1, device)
        self.order = order.to(self.device)
        self.inverse = torch.argsort(self.order)
        self.inner = inner if inner is not None else _Gathered(fn, n, self.order, name)
        self.name, self.groups, self.natural = name, groups, natural

    def describe(self):
        return self.name

    @property
    def density(self) -> float:
        """The reordered mask's (a permutation of rows and keys keeps the count): O(N) for row
        intervals, where the token-order predicate would be evaluated N · S times."""
        return self.inner.density

    def to(self, device):
        inner = self.inner.to(device)
        natural = None if self.natural is None else self.natural.to(device)
        return Reordered(
            self.fn, self.n, self.order, inner, self.name, device, self.groups, natural
        )


class _Gathered(_Function):
    """fn on gathered positions: position a of the reordered sequence is token order[a]."""

    def __init__(self, fn, n, order: Tensor, name: str):
        self.token_fn, self.order, self.name = fn, order, name
        super().__init__(lambda b, h, q, k: fn(b, h, order[q], order[k]), n, n, 1, 1, order.device)

    def describe(self):
        return f"{self.name}, reordered"

    def to(self, device):
        return _Gathered(self.token_fn, self.n, self.order.to(device), self.name)


def _check_int(name: str, what: str, x, low: int) -> None:
    if isinstance(x, bool) or not isinstance(x, int) or x < low:
        raise ValueError(f"{name}: {what} must be an integer >= {low}, got {x!r}")


def _check_order(order, n: int) -> Tensor:
    if not isinstance(order, Tensor) or order.dim() != 1 or order.dtype.is_floating_point:
        got = f"{order.dtype} {tuple(order.shape)}" if isinstance(order, Tensor) else order
        raise ValueError(f"reorder: order must be an integer tensor (N,), got {got!r}")
    order = order.long()
    if order.numel() != n or not torch.equal(torch.sort(order.cpu()).values, torch.arange(n)):
        raise ValueError(f"reorder: order must be a permutation of 0..{n - 1}")
    return order


def reorder(mask: StructuredMask, order: Tensor) -> Reordered:
    """`mask` (from `from_function`, N = S, one mask for every batch row and head), computed
    in the token order `order` (a permutation (N,): position a holds token order[a]) by the
    chunked backend: choose an order that makes the mask's blocks dense or empty (tokens that
    attend to each other side by side). Same results as `mask`."""
    if type(mask) is not _Function or mask.n != mask.s or (mask.batch, mask.heads) != (1, 1):
        raise ValueError(
            f"reorder: mask must come from masks.from_function with N = S and no batch or head "
            f"dependence, got {mask.describe()} {mask.shape}"
        )
    order = _check_order(order, mask.n).to(mask.device)
    return Reordered(mask.fn, mask.n, order, None, f"{mask.describe()}, reordered", mask.device)


def _by_residue(n: int, d: int, device) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Tokens sorted by residue mod d: the order, and for each position its class's start,
    length and its index t in the class (token = residue + t * d)."""
    pos = torch.arange(n, device=device)
    order = torch.argsort(pos % d * n + pos)  # residue first, then position
    r, t = order % d, order // d
    length = (n - r + d - 1) // d  # tokens with residue r
    sizes = (n - torch.arange(d, device=device) + d - 1) // d  # (d,)
    starts = torch.cumsum(sizes, 0) - sizes
    return order, starts[r], length, t


def dilated_window(
    n: int, window: int, dilation: int, *, causal: bool = False, device=None
) -> Reordered:
    """Dilated sliding window (DiNAT, LongNet's dilated segments): query i sees key j when
    i - j is a multiple of `dilation` and |i - j| < window · dilation (with `causal`,
    0 <= i - j < window · dilation): `window` keys either side, one in `dilation`.

    Skipped as a band within each residue class (tokens reordered by i mod dilation)."""
    _check_int("dilated_window", "n", n, 0)
    _check_int("dilated_window", "window", window, 1)
    _check_int("dilated_window", "dilation", dilation, 1)
    name = f"dilated_window({window}, {dilation}{', causal' if causal else ''})"
    return _dilated(n, window, dilation, causal, device, name)


def _dilated(n, window, dilation, causal, device, name) -> Reordered:
    span = window * dilation

    def fn(b, h, q, kv):
        diff = q - kv
        near = (diff < span) & (diff >= 0) if causal else diff.abs() < span
        return near & (diff % dilation == 0)

    order, start, length, t = _by_residue(n, dilation, device)
    lo = start + (t - window + 1).clamp(min=0)
    hi = start + (t + 1 if causal else torch.minimum(t + window, length))
    inner = RowIntervals(lo, hi, n, name + ", reordered")
    groups = Groups(dilation, window, causal) if n % dilation == 0 < n else None
    return Reordered(fn, n, order, inner, name, device, groups)


def strided(n: int, stride: int, *, causal: bool = False, device=None) -> Reordered:
    """Query i sees key j when i ≡ j (mod `stride`) (with `causal`, also j <= i): a video
    model's "temporal" attention over frames of `stride` tokens (each token sees its own place
    in every frame), Sparse Transformer's strided head. Skipped as contiguous documents
    (tokens reordered by residue)."""
    _check_int("strided", "n", n, 0)
    _check_int("strided", "stride", stride, 1)
    name = f"strided({stride}{', causal' if causal else ''})"
    return _dilated(n, max(n, 1), stride, causal, device, name)


def neighborhood_2d(height: int, width: int, kernel: int | tuple[int, int], *, device=None):
    """NATTEN's 2-D neighbourhood on a height × width grid of tokens (row-major, N = height ·
    width): query (y, x) sees the kernel_h × kernel_w keys around it, the window shifted
    inwards at the borders so that every query sees kernel_h · kernel_w keys. `kernel`: odd,
    at most the grid's side (an int for a square window).

    Skipped on tiles of the grid (tokens reordered tile by tile): 8 × 8, or where the blocks of
    another are estimated cheaper, 4 × 4 (7 × 7 and 9 × 9 kernels), 4 × 8 or 8 × 4
    (`_natten_tiles.choose_tile`)."""
    kh, kw = (kernel, kernel) if not isinstance(kernel, tuple) else kernel
    _check_int("neighborhood_2d", "height", height, 1)
    _check_int("neighborhood_2d", "width", width, 1)
    for what, k, side in (("kernel height", kh, height), ("kernel width", kw, width)):
        _check_int("neighborhood_2d", what, k, 1)
        if k % 2 == 0 or k > side:
            raise ValueError(f"neighborhood_2d: {what} must be odd and <= {side}, got {k}")
    rh, rw = kh // 2, kw // 2

    def fn(b, h, q, kv):
        qy, qx, ky, kx = q // width, q % width, kv // width, kv % width
        cy, cx = qy.clamp(rh, height - 1 - rh), qx.clamp(rw, width - 1 - rw)
        return ((cy - ky).abs() <= rh) & ((cx - kx).abs() <= rw)

    order = tile_order(height, width, *choose_tile(height, width, kh, kw), device=device)
    name = f"neighborhood_2d({height}x{width}, {kh}x{kw})"
    natural = natural_runs(height, width, kh, kw, name, device)
    return Reordered(fn, height * width, order, None, name, device, natural=natural)


# The widest kernel whose neighbourhoods the compiled kernel's offset path takes in token order
# (_native/offset_path.h: kOffsetRuns runs a row; a border tile's union of one run's offsets,
# kw + kw // 2 at most, within kOffsetRunKeys = 64; all runs' within kOffsetKeys = 512).
_NATURAL_RUNS, _NATURAL_RUN_KEYS, _NATURAL_KEYS = 16, 64, 512


def natural_runs(height: int, width: int, kh: int, kw: int, name: str, device=None):
    """The neighbourhood in token order as kh runs of kw keys a query (`RowRuns`), which the
    compiled kernel's offset path computes exactly in its interior (8 queries of a canvas row
    share their runs shifted by one a lane), or None where the kernel would not take it.
    Measured (benchmarks/bench_natten.py: AMD EPYC Zen 4, 1 thread, H=8, D=64, forward, time
    / (density x dense time), reordered tiles -> token order): 15 x 15 on 64 x 64 3.20 ->
    1.79, on 128 x 128 3.35 -> 2.12; 7 x 7 on 64 x 64 6.94 -> 2.51, on 128 x 128 6.66 -> 2.46."""
    wide = kw + kw // 2
    if kh > _NATURAL_RUNS or wide > _NATURAL_RUN_KEYS or kh * wide > _NATURAL_KEYS:
        return None
    from attnkit.functional._natten_tiles import neighbours
    from attnkit.functional._row_masks import RowRuns

    q = torch.arange(height * width, device=device)
    first = neighbours(height, width, kh, kw, q)[:, ::kw]  # (N, kh): each run's first key
    lo = first.T[:, None]  # (K, 1, N)
    return RowRuns(lo, lo + kw, height * width, f"{name}, token order")


def reordered_call(mask, q: Tensor, k: Tensor, bias, dropout: bool, causal: bool) -> bool:
    """Whether a chunked call may run `mask` reordered: a `Reordered` mask over these N = S
    tokens, no bias (it would need the same gather), no dropout (whose bits follow the
    positions), no causal limit (`attention` folds it into the mask)."""
    return (
        isinstance(mask, Reordered)
        and bias is None
        and not dropout
        and not causal
        and q.shape[2] == k.shape[2] == mask.n
    )


def run_reordered(
    mask: Reordered, q, k, v, attend: Callable, rows_in_place: bool = False
) -> tuple[Tensor, Tensor]:
    """attend(q, k, v, m=inner mask) on the reordered tokens; out and lse put back in order.
    With `groups`, attend(q, k, v, m=window or None, causal=...) once on the interleaved
    sequences, no gather (`attend` must take the causal and groups keywords). With
    `rows_in_place` (the compiled kernel), attend(q, k', v', m=inner, qrows=order): only k and
    v are gathered, the kernel reading q and writing out and lse (and in the backward reading
    dO and writing dq) at row order[a] for position a (`Args::qrows`), which saves three of
    the five gathers of a forward and two of the backward's four (~13 ms each at N=16384,
    H=8, D=64 on AMD EPYC Zen 4, against a NATTEN 15 x 15 forward of ~315 ms)."""
    if mask.groups is not None:
        return attend(q, k, v, **group_call(mask.groups, q.shape[2] // mask.groups.count))
    order, back = mask.order.to(q.device), mask.inverse.to(q.device)
    kv = (permute(t, order, back) for t in (k, v))
    if rows_in_place:
        return attend(q, *kv, m=mask.inner, qrows=order)
    out, lse = attend(permute(q, order, back), *kv, m=mask.inner)
    return permute(out, back, order), permute(lse, back, order)


def permute(x: Tensor, order: Tensor, inverse: Tensor) -> Tensor:
    """x (B, H, N, ...) with position a holding token order[a] (`inverse` = argsort(order));
    differentiable, its gradient permuted back the same way."""
    return _Permute.apply(x, order, inverse)


class _Permute(torch.autograd.Function):
    """A permutation of the token axis whose gradient is the inverse permutation, a gather:
    index_select's gradient scatters into zeros (index_add_), twice the memory traffic."""

    @staticmethod
    def forward(ctx, x, order, inverse):
        ctx.order, ctx.inverse = order, inverse
        return _take(x, order)

    @staticmethod
    def backward(ctx, grad):
        return _Permute.apply(grad, ctx.inverse, ctx.order), None, None


def _take(x: Tensor, order: Tensor) -> Tensor:
    """x[:, :, order] as contiguous rows. A contiguous x is read as (B·H·N, rest) rows and
    gathered along its first axis: 2-3x faster than index_select along axis 2, which walks the
    (B, H) axes element by element (AMD EPYC Zen 4, (1, 8, 4096, 64) float32: 0.9 vs 1.8 ms;
    the reordered NATTEN forward does five of these)."""
    if not x.is_contiguous() or x.numel() == 0:
        return x.index_select(2, order)
    b, h, n = x.shape[:3]
    rows = x.view(b * h * n, -1)  # (B·H·N, rest)
    flat = (torch.arange(b * h, device=x.device)[:, None] * n + order).flatten()  # (B·H·N,)
    out = empty_hinted(x)  # fresh: at (1, 8, 16384, 64) its page faults outweigh the gather
    torch.index_select(rows, 0, flat, out=out.view(rows.shape))
    return out


def group_call(groups: Groups, t: int) -> dict:
    """The keywords of one call on the interleaved sequences of `t` tokens each: their mask
    (a window, or None when it reaches every position), causal limit and number."""
    if groups.window < t:
        m, causal = _group_window(t, groups.window, groups.causal), False
    else:  # every position within reach: no mask but the causal limit
        m, causal = None, groups.causal
    return {"m": m, "causal": causal, "groups": groups.count}


@functools.lru_cache(maxsize=64)
def _group_window(t: int, w: int, causal: bool) -> StructuredMask:
    """The same window object for every call of a size: the kernel's plan of a mask (its row
    intervals, the query block chosen for them) is cached on the mask, and a new window each
    call planned it again. That cost ~2 ms a call on one thread and 50 ms on two on a loaded
    machine (AMD EPYC, N=4096, dilation 4: the plan's small torch reductions each wait for
    both threads), a third of the dilated window's forward."""
    return _window(t, w, causal=causal)


def split_groups(x: Tensor, g: int) -> Tensor:
    """(B, H, T·g, ...) -> (B·g, H, T, ...), contiguous: token t·g + r of batch row b is
    position t of batch row b·g + r (g = 1: x itself)."""
    if g == 1:
        return x
    return x.unflatten(2, (-1, g)).movedim(3, 1).flatten(0, 1).contiguous()


def merge_groups(x: Tensor, g: int) -> Tensor:
    """`split_groups` undone: (B·g, H, T, ...) -> (B, H, T·g, ...)."""
    if g == 1:
        return x
    return x.unflatten(0, (-1, g)).movedim(1, 3).flatten(2, 3)
