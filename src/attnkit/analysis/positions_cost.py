"""What relative positions cost: RoPE, ALiBi, T5 bias (elementwise FLOPs, no matmul).

Dimensions: B batch, N query tokens, S key tokens, H query heads, G key/value
heads, d head width, R rotary width.

Relative positions add no matmul; their work is elementwise, counted as FLOPs
(not MACs) in `Cost.elementwise`, by the conventions of
`attnkit.functional.rotary` and `attnkit.functional.relative`. Add the result to
`mha_cost(...)` for the whole layer. A stack of `layers` layers shares one
position table (as T5 and ALiBi models do), so these take `layers` instead of
being multiplied: ``k * cost`` would count the table k times.
"""

from __future__ import annotations

from attnkit.analysis.cost import Cost, _check_positive

__all__ = ["alibi_cost", "relative_bias_cost", "rotary_cost"]


def rotary_cost(
    n: int,
    heads: int,
    head_dim: int,
    *,
    kv_heads: int | None = None,
    rotary_dim: int | None = None,
    batch: int = 1,
    layers: int = 1,
) -> Cost:
    """RoPE on the queries and keys of self-attention (Su et al. 2021), forward.

    Each rotated channel costs 3 FLOPs (a pair (a, b) becomes (a·cos - b·sin,
    b·cos + a·sin): 4 multiplies and 2 adds per pair), on B·N·H query and B·N·G
    key rows of R channels: 3·B·N·(H + G)·R per layer. In a cached decoder only
    the N new tokens are rotated. The cos/sin tables are built once and cached
    by `RotaryEmbedding` (not counted); no parameters.
    """
    _check_positive(n=n, heads=heads, head_dim=head_dim, kv_heads=kv_heads,
                    rotary_dim=rotary_dim, batch=batch, layers=layers)  # fmt: skip
    r = head_dim if rotary_dim is None else rotary_dim
    if r > head_dim or r % 2:
        raise ValueError(f"rotary_dim={r} must be even and <= head_dim={head_dim}")
    g = heads if kv_heads is None else kv_heads
    return Cost(terms={}, elementwise={"rotary": layers * 3 * batch * n * (heads + g) * r})


def alibi_cost(
    n: int,
    heads: int,
    *,
    context_len: int | None = None,
    batch: int = 1,
    layers: int = 1,
    symmetric: bool = False,
) -> Cost:
    """ALiBi (Press et al. 2022): its table, built once, and one bias add per score per layer.

    Table (`alibi_bias`): N·S differences p_j - p_i (+ 2·N·S for |·| and its sign
    when `symmetric`), then H·N·S multiplies by the slopes. The add to the
    scores: B·H·N·S per layer (S = context_len, the cached + new keys when
    decoding; default N). No parameters.
    """
    _check_positive(n=n, heads=heads, context_len=context_len, batch=batch, layers=layers)
    s = n if context_len is None else context_len
    table = (3 if symmetric else 1) * n * s + heads * n * s
    return Cost(
        terms={},
        elementwise={"alibi table": table, "position bias": layers * batch * heads * n * s},
    )


def relative_bias_cost(
    n: int,
    heads: int,
    *,
    context_len: int | None = None,
    num_buckets: int = 32,
    batch: int = 1,
    layers: int = 1,
) -> Cost:
    """T5's relative position bias (Raffel et al. 2020): buckets, one table, one add per score.

    Buckets (`relative_position_bucket`): 4 float ops per (i, j) pair on the log
    branch (divide, log, divide, multiply; the rest is integer work), N·S pairs.
    The lookup in the (num_buckets, H) table is a gather (memory, no FLOPs);
    T5 holds one table in its first layer and every layer adds the bias:
    B·H·N·S per layer. Parameters: num_buckets·H.
    """
    _check_positive(n=n, heads=heads, context_len=context_len, num_buckets=num_buckets,
                    batch=batch, layers=layers)  # fmt: skip
    s = n if context_len is None else context_len
    return Cost(
        terms={},
        params=num_buckets * heads,
        elementwise={"t5 buckets": 4 * n * s, "position bias": layers * batch * heads * n * s},
    )
