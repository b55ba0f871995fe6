"""One attention configuration of `attnkit bench` (`Case`): the sizes, mask and dropout a
kernel row or a peak-memory row measures. Apart from `bench` so that the memory rows
(`_bench_memory`) can name it without importing the benchmark."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["MASKS", "Case"]

MASKS = ("none", "causal", "padding", "bool")


@dataclass(frozen=True)
class Case:
    """One attention configuration (B=1, H=8, D=64 unless said otherwise)."""

    n: int  # N = S
    mask: str  # one of MASKS
    dropout: float  # attention dropout while training
    dtype: str = "float32"  # "float32" or "bfloat16"
    b: int = 1
    h: int = 8
    d: int = 64

    @property
    def score_bytes(self) -> int:
        """The float32 (B, H, N, S) score matrix of all heads."""
        return 4 * self.b * self.h * self.n * self.n
