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
