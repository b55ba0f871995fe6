"""Constructor argument checks shared by every module, model and config.

Each returns the value it accepted, so a constructor can check and assign in
one line, and raises ValueError naming the argument and what was wanted.
"""

from __future__ import annotations

import numbers


def positive_int(name: str, value, *, optional: bool = False):
    """`value` as an int >= 1 (bool is refused: True is not a size); None if `optional`."""
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


def nonnegative_int(name: str, value) -> int:
    """`value` as an int >= 0 (counts where 0 means "none", e.g. no classifier head)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0:
        raise ValueError(f"{name} must be an integer >= 0, got {value!r}")
    return int(value)


def positive_number(name: str, value) -> float:
    """`value` as a finite float > 0 (ratios such as mlp_ratio)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0 < value < 1e308:
        raise ValueError(f"{name} must be a positive number, got {value!r}")
    return float(value)


def probability(name: str, value) -> float:
    """`value` as a float in [0, 1): a dropout rate (1 would drop everything)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0 <= value < 1:
        raise ValueError(f"{name} must be in [0, 1), got {value!r}")
    return float(value)


def check_image(x, channels: int, size: int, who: str) -> None:
    """Images (B, channels, size, size), else ValueError naming `who` and both shapes."""
    if x.dim() != 4 or x.shape[1:] != (channels, size, size):
        raise ValueError(
            f"{who}: images must have shape (B, {channels}, {size}, {size}), got {tuple(x.shape)}"
        )


def per_token(value, batch: int, n: int, *, name: str, over: str = ""):
    """`value` as an int64 tensor (B|1, N): one integer per token of N, given as (N,) or
    (B, N) with B = `batch` (positions, document ids); `over` says what the N tokens are."""
    import torch

    ok = isinstance(value, torch.Tensor) and value.dim() in (1, 2) and value.shape[-1] == n
    ok = ok and not value.dtype.is_floating_point and value.dtype != torch.bool
    if ok and value.dim() == 2:
        ok = value.shape[0] in (1, batch)
    if not ok:
        got = (
            f"{value.dtype} {tuple(value.shape)}"
            if isinstance(value, torch.Tensor)
            else type(value).__name__
        )
        raise ValueError(f"{name} must be integers ({n},) or ({batch}, {n}){over}, got {got}")
    return value.long() if value.dim() == 2 else value.long()[None]  # (B|1, N)


def position_ids(value, batch: int, n: int, *, limit: int | None = None, name="position_ids"):
    """`value` as an int64 tensor (B|1, N): the positions of N tokens, given as (N,) or (B, N)
    with B = `batch`, each >= 0 and, when `limit` is given, < `limit` (a table's length)."""
    from attnkit.functional._trace import tracing

    value = per_token(value, batch, n, name=name)
    # the values are read only where they exist (not on meta) and in eager code
    if value.numel() and value.device.type != "meta" and not tracing():
        low, high = int(value.min()), int(value.max())
        if low < 0 or (limit is not None and high >= limit):
            within = "" if limit is None else f" and < {limit}"
            raise ValueError(f"{name} must be >= 0{within}, got values {low}..{high}")
    return value
