"""Score functions: FlexAttention's ``score_mod(score, b, h, q_idx, kv_idx)``, computed where the
scores are.

Dimensions: B batch, H query heads, N queries, S keys; a block covers queries i0:i1 (nq) and
keys j0:j1 (nk).

`attnkit.attention(q, k, v, score_mod=fn)` computes, for every entry it may attend,

    s = scale · q·kᵀ            the scaled dot product, as FlexAttention's `score`
    s = fn(s, b, h, q_idx, kv_idx)
    s = s + bias                attnkit's additive `bias=` (after the score function, so a -inf
                                in it stays -inf: soft-capping cannot unmask a padded key)
    s = -inf where masked       mask, structured mask, causal (bottom-right when N != S)
    out = softmax(s) · v

`fn` is called on blocks, never on a (B, H, N, S) tensor (except by the reference backend, the
truth): `score` is a float tensor (…, nq, nk) and `b`, `h`, `q_idx`, `kv_idx` are int64 tensors
that broadcast against it ((B|1, 1, 1, 1), (1, H, 1, 1), (1, 1, nq, 1), (1, 1, 1, nk)). So `fn`
must be vectorised: written with torch operations, no `if` on a value, no `.item()`, returning
a tensor that broadcasts to `score`'s shape (FlexAttention calls it through vmap, which
accepts the same functions). The indices are FlexAttention's raw ones: q_idx in 0..N-1,
kv_idx in 0..S-1. attnkit's causal masks put query i at key position i + S - N (decoding with a
cache); a score function that measures distances in that frame adds S - N to q_idx itself, as
the built-ins do with their ``offset=``.

Gradients flow through `fn` into the scores and into every tensor it closes over (a learned
table, slopes), exactly; the built-ins below are also run by the compiled CPU kernel.

Built-ins (each a `ScoreMod`; compose them with `compose`, or with ``a + b``, which means "a,
then b"):

* `softcap(cap)`: cap · tanh(s / cap) (Gemma 2, Grok).
* `alibi(slopes)`: s + m_h · (kv - q), ALiBi (Press et al. 2022) with head slopes m (H,).
* `relative_bias(table, index)`: s + table[index(q_idx, kv_idx), h] for a learned table
  (buckets, H) and an index: `t5_buckets(...)` (T5), `window_offsets(M)` (Swin's (2M-1)² table),
  or any vectorised function of (q_idx, kv_idx).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor

from attnkit.functional.relative import relative_position_bucket

__all__ = [
    "ScoreMod",
    "alibi",
    "apply",
    "check",
    "compose",
    "relative_bias",
    "softcap",
    "t5_buckets",
    "window_offsets",
]

ScoreFn = Callable[[Tensor, Tensor, Tensor, Tensor, Tensor], Tensor]


class ScoreMod:
    """A built-in score function: callable as ``fn(score, b, h, q_idx, kv_idx)``.

    `parts` lists the built-ins it applies in order (one, or several for a composition);
    `additive` says that it only adds a bias that does not depend on the score, so a backend
    that takes a dense bias (SDPA) can be handed ``fn(0, ...)``.
    """

    additive = False

    def __call__(self, score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor):
        raise NotImplementedError

    @property
    def parts(self) -> tuple[ScoreMod, ...]:
        return (self,)

    def tensors(self) -> tuple[Tensor, ...]:
        """The tensors this function closes over (tables, slopes)."""
        return ()

    def check(self, heads: int, n: int, s: int, device: torch.device) -> None:
        """Raise ValueError if this function cannot serve a call with H = `heads`, N = `n`,
        S = `s` on `device` (a table of another head count, a window too small)."""

    def __add__(self, other):
        """``a + b``: a, then b (as `compose`)."""
        if not callable(other):
            return NotImplemented
        return compose(self, other)

    def __radd__(self, other):
        if not callable(other):
            return NotImplemented
        return compose(other, self)


class _Softcap(ScoreMod):
    def __init__(self, cap: float):
        self.cap = cap

    def __call__(self, score, b, h, q_idx, kv_idx):
        # tanh's gradient 1 - tanh² is what the kernels use (Gemma 2's attn_logit_softcapping)
        return torch.tanh(score / self.cap) * self.cap

    def __repr__(self) -> str:
        return f"softcap({self.cap})"


class _Alibi(ScoreMod):
    additive = True

    def __init__(self, slopes: Tensor, offset: int, symmetric: bool):
        self.slopes, self.offset, self.symmetric = slopes, offset, symmetric

    def __call__(self, score, b, h, q_idx, kv_idx):
        rel = kv_idx - (q_idx + self.offset)  # (…, nq, nk): p_j - p_i
        if self.symmetric:
            rel = -rel.abs()
        return score + self.slopes[h] * rel.to(self.slopes.dtype)

    def tensors(self):
        return (self.slopes,)

    def check(self, heads, n, s, device):
        _check_table("alibi: slopes", self.slopes, self.slopes.shape[0], heads, device)

    def __repr__(self) -> str:
        extra = f", offset={self.offset}" if self.offset else ""
        return f"alibi(H={self.slopes.shape[0]}{extra}{', symmetric' if self.symmetric else ''})"


class _T5Buckets:
    """T5's bucket of the distance kv - (q + offset) (`relative_position_bucket`)."""

    def __init__(self, num_buckets: int, max_distance: int, bidirectional: bool, offset: int):
        self.num_buckets, self.max_distance = num_buckets, max_distance
        self.bidirectional, self.offset = bidirectional, offset
        relative_position_bucket(torch.zeros(1), **self._args())  # checks the sizes now

    def _args(self) -> dict:
        return {
            "num_buckets": self.num_buckets,
            "max_distance": self.max_distance,
            "bidirectional": self.bidirectional,
        }

    def __call__(self, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        return relative_position_bucket(kv_idx - (q_idx + self.offset), **self._args())

    def __repr__(self) -> str:
        return (
            f"t5_buckets({self.num_buckets}, max_distance={self.max_distance}, "
            f"bidirectional={self.bidirectional}, offset={self.offset})"
        )


class _WindowOffsets:
    """Swin's index (Liu et al. 2021, §3.2): token t of an M×M window sits at (t // M, t % M);
    query i and key j read entry (yi - yj + M - 1)·(2M - 1) + (xi - xj + M - 1) of the
    (2M-1)² table (`attnkit.vision.relative_position_index`, computed per block)."""

    def __init__(self, window_size: int):
        self.window_size = window_size

    def __call__(self, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        m = self.window_size
        dy = q_idx.div(m, rounding_mode="floor") - kv_idx.div(m, rounding_mode="floor")
        dx = q_idx % m - kv_idx % m
        return (dy + m - 1) * (2 * m - 1) + (dx + m - 1)

    def __repr__(self) -> str:
        return f"window_offsets({self.window_size})"


class _RelativeBias(ScoreMod):
    additive = True

    def __init__(self, table: Tensor, index):
        self.table, self.index = table, index

    def __call__(self, score, b, h, q_idx, kv_idx):
        idx = self.index(q_idx, kv_idx)  # (…, nq, nk) long
        return score + self.table[idx, h]  # table (buckets, H)

    def tensors(self):
        return (self.table,)

    def check(self, heads, n, s, device):
        _check_table("relative_bias: table", self.table, self.table.shape[-1], heads, device)
        if isinstance(self.index, _WindowOffsets) and max(n, s) > self.index.window_size**2:
            m = self.index.window_size
            raise ValueError(
                f"relative_bias with window_offsets({m}): the call has N={n} queries and S={s} "
                f"keys, but one {m}×{m} window holds {m * m} tokens; attend window by window"
            )

    def __repr__(self) -> str:
        return f"relative_bias(table {tuple(self.table.shape)}, {self.index!r})"


class _Compose(ScoreMod):
    def __init__(self, fns: tuple):
        self.fns = fns
        self.additive = all(isinstance(f, ScoreMod) and f.additive for f in fns)

    def __call__(self, score, b, h, q_idx, kv_idx):
        for fn in self.fns:
            score = fn(score, b, h, q_idx, kv_idx)
        return score

    @property
    def parts(self):
        return tuple(p for f in self.fns for p in (f.parts if isinstance(f, ScoreMod) else (f,)))

    def tensors(self):
        return tuple(t for f in self.fns if isinstance(f, ScoreMod) for t in f.tensors())

    def __repr__(self) -> str:
        return "compose(" + ", ".join(repr(f) for f in self.fns) + ")"


def _check_table(name: str, t: Tensor, got: int, heads: int, device) -> None:
    if got != heads:
        raise ValueError(
            f"{name} of shape {tuple(t.shape)} has {got} heads, the call H={heads}: build it "
            f"for {heads} heads"
        )
    if t.device != device:
        raise ValueError(f"{name} is on {t.device}, the call's q on {device}")


def check(fn, heads: int, n: int, s: int, device) -> None:
    """Check every built-in part of `fn` against the call (see `ScoreMod.check`)."""
    if isinstance(fn, ScoreMod):
        for part in fn.parts:
            if isinstance(part, ScoreMod):
                part.check(heads, n, s, device)


def _int(name: str, value, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return value


def softcap(cap: float) -> ScoreMod:
    """Tanh soft-capping: s -> cap · tanh(s / cap), which keeps every score in (-cap, cap)
    (Gemma 2's ``attn_logit_softcapping``, 50.0; Grok's 30.0). `cap` > 0, finite."""
    if isinstance(cap, bool) or not isinstance(cap, int | float) or not 0 < cap < math.inf:
        raise ValueError(f"softcap: cap must be a finite number > 0, got {cap!r}")
    return _Softcap(float(cap))


def alibi(slopes: Tensor, *, offset: int = 0, symmetric: bool = False) -> ScoreMod:
    """ALiBi (Press et al. 2022): s + m_h · (kv - (q + offset)), slopes m (H,) (e.g.
    `attnkit.functional.alibi_slopes(H)`).

    `offset` places query i at key position i + offset: pass S - N for attnkit's bottom-right
    frame (a decode step with a cache), which `attnkit.functional.alibi_bias` uses. With
    `symmetric`, -m_h · |kv - (q + offset)| (encoders without a causal mask). The slopes get
    gradients if they require them.
    """
    if not isinstance(slopes, Tensor) or slopes.dim() != 1 or not slopes.dtype.is_floating_point:
        got = f"{slopes.dtype} {tuple(slopes.shape)}" if isinstance(slopes, Tensor) else slopes
        raise ValueError(f"alibi: slopes must be a float tensor of shape (H,), got {got!r}")
    if isinstance(offset, bool) or not isinstance(offset, int):
        raise ValueError(f"alibi: offset must be an integer, got {offset!r}")
    return _Alibi(slopes, offset, bool(symmetric))


def t5_buckets(
    num_buckets: int = 32, max_distance: int = 128, *, bidirectional: bool = True, offset: int = 0
):
    """T5's index (Raffel et al. 2020, §2.1) for `relative_bias`: the bucket of kv - (q + offset),
    as `attnkit.functional.relative_position_bucket` computes it (transformers' T5 exactly)."""
    _int("num_buckets", num_buckets, 2)
    _int("max_distance", max_distance, 1)
    if isinstance(offset, bool) or not isinstance(offset, int):
        raise ValueError(f"t5_buckets: offset must be an integer, got {offset!r}")
    return _T5Buckets(num_buckets, max_distance, bool(bidirectional), offset)


def window_offsets(window_size: int):
    """Swin's index for `relative_bias`: tokens of one M×M window, numbered row by row, read
    the (2M-1)² table at their 2-D offset (`attnkit.vision.relative_position_index`)."""
    return _WindowOffsets(_int("window_size", window_size, 1))


def relative_bias(table: Tensor, index) -> ScoreMod:
    """s + table[index(q_idx, kv_idx), h]: a learned relative-position table (buckets, H),
    indexed per entry by `index`, which maps (q_idx, kv_idx) to int64 rows of the table:
    `t5_buckets(...)`, `window_offsets(M)` or a vectorised function of your own. The table gets
    its gradient (dtable[bucket, h] = Σ of dS over the entries that read it)."""
    if not isinstance(table, Tensor) or table.dim() != 2 or not table.dtype.is_floating_point:
        got = f"{table.dtype} {tuple(table.shape)}" if isinstance(table, Tensor) else table
        raise ValueError(f"relative_bias: table must be a float tensor (buckets, H), got {got!r}")
    if not callable(index):
        raise ValueError(f"relative_bias: index must be callable (q_idx, kv_idx), got {index!r}")
    size = _index_size(index)
    if size is not None and table.shape[0] != size:
        raise ValueError(
            f"relative_bias: {index!r} reads {size} rows, but table has shape "
            f"{tuple(table.shape)}; it must be ({size}, H)"
        )
    return _RelativeBias(table, index)


def _index_size(index) -> int | None:
    if isinstance(index, _T5Buckets):
        return index.num_buckets
    if isinstance(index, _WindowOffsets):
        return (2 * index.window_size - 1) ** 2
    return None


def compose(*fns: ScoreFn) -> ScoreFn:
    """One score function that applies `fns` in order: ``compose(f, g)(s, …) = g(f(s, …), …)``."""
    if not fns:
        raise ValueError("compose: give at least one score function")
    for i, fn in enumerate(fns):
        if not callable(fn):
            raise ValueError(f"compose: argument {i} must be a score function, got {fn!r}")
    flat = tuple(p for f in fns for p in (f.fns if isinstance(f, _Compose) else (f,)))
    return flat[0] if len(flat) == 1 else _Compose(flat)


_VECTORISE = (
    "score_mod must be vectorised: it is called once per block of scores with tensors "
    "(score (…, nq, nk); b, h, q_idx, kv_idx int64 tensors broadcasting against it), so it "
    "must use torch operations, with no Python `if` on a value and no .item()"
)


def apply(fn: ScoreFn, score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor):
    """``fn(score, b, h, q_idx, kv_idx)`` on one block, checked: a function that works only
    element by element, or returns something of another shape, gets a ValueError naming
    vectorisation."""
    try:
        out = fn(score, b, h, q_idx, kv_idx)
    except (RuntimeError, TypeError) as e:
        text = str(e)
        if "ambiguous" in text or "only one element" in text or "converted to Python" in text:
            raise ValueError(f"{_VECTORISE}; calling it raised: {text}") from e
        raise
    if not isinstance(out, Tensor) or not out.dtype.is_floating_point:
        got = f"{out.dtype} tensor" if isinstance(out, Tensor) else type(out).__name__
        raise ValueError(f"{_VECTORISE}; it must return a float tensor, returned a {got}")
    if out.shape != score.shape:
        try:
            out = out.expand(score.shape)
        except RuntimeError:
            raise ValueError(
                f"{_VECTORISE}; given a score block of shape {tuple(score.shape)} it returned "
                f"shape {tuple(out.shape)}"
            ) from None
    return out if out.dtype == score.dtype else out.to(score.dtype)


def indices(b: int, h: int, i0: int, i1: int, j0: int, j1: int, device):
    """The index tensors of block [i0:i1, j0:j1] of a (B, H, N, S) score tensor, int64,
    shaped (B, 1, 1, 1), (1, H, 1, 1), (1, 1, nq, 1), (1, 1, 1, nk)."""
    kw = {"dtype": torch.int64, "device": device}
    return (
        torch.arange(b, **kw).view(b, 1, 1, 1),
        torch.arange(h, **kw).view(1, h, 1, 1),
        torch.arange(i0, i1, **kw).view(1, 1, i1 - i0, 1),
        torch.arange(j0, j1, **kw).view(1, 1, 1, j1 - j0),
    )


def dense_bias(fn: ScoreMod, b: int, h: int, n: int, s: int, dtype, device) -> Tensor:
    """An additive score function as the dense (B|1, H, N, S) bias it adds: what SDPA (the
    fused backend) is handed, in O(B·H·N·S) memory; the other backends never build it."""
    zero = torch.zeros((), dtype=dtype, device=device)
    bi, hi, qi, ki = indices(1, h, 0, n, 0, s, device)
    return fn(zero, bi, hi, qi, ki).expand(1, h, n, s)
