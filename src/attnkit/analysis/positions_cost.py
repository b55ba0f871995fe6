"""What relative positions cost: RoPE, ALiBi, T5's buckets, soft-capping (no matmul).

Dimensions: B batch, N query tokens, S key tokens, H query heads, G key/value
heads, d head width, R rotary width, L = N + S - 1 distances of a call.

Relative positions add no matmul; their work is elementwise, counted as FLOPs
(not MACs) in `Cost.elementwise`, and the tensors they hold go to `Cost.memory`
(elements). Add the result to `mha_cost(...)` for the whole layer. A stack of
`layers` layers shares one position table (as T5 and ALiBi models do), so these
take `layers` instead of being multiplied: ``k * cost`` would count the table k times.

Two ways to run a relative bias, both in attnkit, same numbers:

* score function (the default, ``dense=False``): ``attention(..., score_mod=)``
  with `attnkit.score_mods.alibi` / `relative_bias` (``AlibiBias.score_mod(n, s)``,
  ``RelativePositionBias.score_mod(n, s)``, Swin's `WindowAttention`). The kernel
  computes the bias where the scores are, block by block: per score a few FLOPs
  (an add, a multiply by the slope, a table read), and memory O(H) (slopes) or
  O(H·L) (the table read along the L distances of the call): never (N, S).
  The counts follow attnkit's compiled CPU kernel (``score_mod_add`` in
  ``_native/attention_cpu.cpp``), which runs the score function only on the key
  blocks it visits: under a causal or structured mask, fewer scores than N·S.
  The PyTorch kernel (a score function of your own, slopes that want a gradient,
  tracing) does the same work per score, except that ALiBi's multiply is shared
  by the batch (H·N·S) and T5's buckets are computed per (query, key) pair of
  each block (4·N·S). Swin's table: `attnkit.analysis.window_cost`.
* dense (``dense=True``): the classic ``bias=`` of shape (1, H, N, S), built
  once and added to every score (``AlibiBias(H)(n, s)``, ``RelativePositionBias``'s
  ``forward``, `alibi_bias`; the ``fused`` backend builds the same from a score
  function for SDPA): O(H·N·S) memory, as the papers' code does.
"""

from __future__ import annotations

from attnkit.analysis._cost_record import Cost, _check_positive

__all__ = ["alibi_cost", "relative_bias_cost", "rotary_cost", "softcap_cost"]

# FLOPs per score of each score function in the compiled kernel (`score_mod_add`): ALiBi
# multiplies the distance by the head's slope and adds it (its |·| once more when symmetric);
# a relative table is read (memory) and added; softcap is s·(1/cap), tanh, ·cap (the tanh
# counted as one, as softmax's exp).
ALIBI_FLOPS_PER_SCORE = 2
RELATIVE_FLOPS_PER_SCORE = 1
SOFTCAP_FLOPS_PER_SCORE = 3
# Float ops of T5's bucket per distance on the log branch: divide, log, divide, multiply
# (`relative_position_bucket`; the rest is integer work).
T5_BUCKET_FLOPS = 4


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
    by `RotaryEmbedding` (no FLOPs counted), (P, R/2) each for P positions, P the
    power of two >= max(N, 64) (`RotaryEmbedding.tables` grows them so): memory P·R,
    O(N). No parameters.
    """
    _check_positive(n=n, heads=heads, head_dim=head_dim, kv_heads=kv_heads,
                    rotary_dim=rotary_dim, batch=batch, layers=layers)  # fmt: skip
    r = head_dim if rotary_dim is None else rotary_dim
    if r > head_dim or r % 2:
        raise ValueError(f"rotary_dim={r} must be even and <= head_dim={head_dim}")
    g = heads if kv_heads is None else kv_heads
    cached = max(64, 1 << (n - 1).bit_length())  # positions in the cached tables
    return Cost(terms={}, elementwise={"rotary": layers * 3 * batch * n * (heads + g) * r},
                memory={"rotary tables": cached * r})  # fmt: skip


def alibi_cost(
    n: int,
    heads: int,
    *,
    context_len: int | None = None,
    batch: int = 1,
    layers: int = 1,
    symmetric: bool = False,
    dense: bool = False,
) -> Cost:
    """ALiBi (Press et al. 2022): s + m_h·(j - i) on every score, per layer. No parameters.

    Score function (default; `attnkit.score_mods.alibi`): a multiply by the slope and an
    add per score, 2·B·H·N·S FLOPs per layer (3 with `symmetric`: the |j - i|); the
    distance j - i is index arithmetic. Memory: the H slopes.

    `dense` (`alibi_bias`, a ``bias=`` (1, H, N, S)): the table is built once, N·S
    differences p_j - p_i (+ 2·N·S for |·| and its sign when `symmetric`) and H·N·S
    multiplies by the slopes, then one add per score, B·H·N·S per layer. Memory: the
    H·N·S bias, shared by the layers and the batch.

    S = context_len, the cached + new keys when decoding (default N).
    """
    _check_positive(n=n, heads=heads, context_len=context_len, batch=batch, layers=layers)
    s = n if context_len is None else context_len
    scores = layers * batch * heads * n * s
    if not dense:
        per_score = ALIBI_FLOPS_PER_SCORE + (1 if symmetric else 0)
        return Cost(terms={}, elementwise={"position bias": per_score * scores},
                    memory={"alibi slopes": heads})  # fmt: skip
    table = (3 if symmetric else 1) * n * s + heads * n * s
    return Cost(
        terms={},
        elementwise={"alibi table": table, "position bias": scores},
        memory={"alibi bias": heads * n * s},
    )


def relative_bias_cost(
    n: int,
    heads: int,
    *,
    context_len: int | None = None,
    num_buckets: int = 32,
    batch: int = 1,
    layers: int = 1,
    dense: bool = False,
) -> Cost:
    """T5's relative position bias (Raffel et al. 2020): buckets, one table, one add per score.

    T5 holds one (num_buckets, H) table (parameters: num_buckets·H) and every layer adds
    its bias: a table read (memory, no FLOP) and an add per score, B·H·N·S per layer.
    The bucket of a distance (`relative_position_bucket`) costs 4 float ops (divide,
    log, divide, multiply; the rest is integer work).

    Score function (default; `attnkit.score_mods.relative_bias` with `t5_buckets`): each
    call buckets only its L = N + S - 1 distances, 4·L per layer, and reads the table
    along them, (H, L) values and L indices: O(H·(N + S)) memory, never (N, S). That is
    one call's; in training each layer keeps its (H, L) values for backward.

    `dense` (``RelativePositionBias.forward``, a ``bias=`` (1, H, N, S)): the N·S
    pairs are bucketed once (4·N·S, an (N, S) index) and gathered into the H·N·S bias,
    shared by the layers and the batch.
    """
    _check_positive(n=n, heads=heads, context_len=context_len, num_buckets=num_buckets,
                    batch=batch, layers=layers)  # fmt: skip
    s = n if context_len is None else context_len
    adds = RELATIVE_FLOPS_PER_SCORE * layers * batch * heads * n * s
    if dense:
        buckets, memory = T5_BUCKET_FLOPS * n * s, {"t5 bias": heads * n * s, "t5 index": n * s}
    else:
        dists = n + s - 1
        buckets = layers * T5_BUCKET_FLOPS * dists
        memory = {"t5 values": heads * dists, "t5 index": dists}
    return Cost(
        terms={},
        params=num_buckets * heads,
        elementwise={"t5 buckets": buckets, "position bias": adds},
        memory=memory,
    )


def softcap_cost(
    n: int, heads: int, *, context_len: int | None = None, batch: int = 1, layers: int = 1
) -> Cost:
    """Tanh soft-capping of the scores, cap·tanh(s / cap) (Gemma 2; `attnkit.score_mods.softcap`):
    3 FLOPs per score (a multiply by 1/cap, the tanh, a multiply by cap), 3·B·H·N·S per
    layer. A score function with nothing to hold: no memory, no parameters."""
    _check_positive(n=n, heads=heads, context_len=context_len, batch=batch, layers=layers)
    s = n if context_len is None else context_len
    return Cost(
        terms={}, elementwise={"softcap": SOFTCAP_FLOPS_PER_SCORE * layers * batch * heads * n * s}
    )
