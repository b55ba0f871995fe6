"""What Swin's window attention costs (Liu et al. 2021): windows, padding, the relative bias.

Dimensions: B batch, h×w grid of tokens (h'×w' once padded to multiples of M), C width,
H heads, M window side (M² tokens per window, nW windows).
"""

from __future__ import annotations

import math

from attnkit.analysis._cost_record import Cost, _batched, _check_positive
from attnkit.analysis.cost import mha_cost
from attnkit.analysis.positions_cost import RELATIVE_FLOPS_PER_SCORE

__all__ = ["swin_window_cost"]


def swin_window_cost(
    grid_h: int,
    grid_w: int,
    dim: int,
    heads: int,
    window: int,
    shifted: bool = False,
    *,
    qkv_bias: bool = True,
    batch: int = 1,
    dense: bool = False,
) -> Cost:
    """Window attention (W-MSA / SW-MSA) of one Swin block on an h×w grid of tokens.

    The grid is padded up to multiples of M (Swin pads before the qkv
    projection, so padded tokens are projected and attended like real ones and
    are counted here): with h', w' the padded sizes, the MACs are
    4h'w'C² + 2M²h'w'C (Liu et al. 2021, eq. 2, with padding).

    The shifted variant (SW-MSA) costs the same matmuls: the cyclic shift is a
    roll and the shift mask is an elementwise select. As in Swin's code, a grid no
    larger than the window becomes one window of min(h, w) and is not shifted.

    The relative-position bias: one table read and one add per score,
    B·nW·H·M²·M² ("position bias"), on either path. attnkit's `WindowAttention` runs
    it as a score function (`attnkit.score_mods.relative_bias` with `window_offsets(M)`):
    the compiled kernel reads the table along the (2M - 1)² 2-D offsets, H·(2M - 1)²
    values and (2M - 1)² + 2M² indices (the offsets, and each token's position in
    its window), the size of the table. `dense` counts Swin's own code instead
    (``WindowAttention.relative_bias()``): the (H, M², M²) bias gathered through an
    (M², M²) index, H·M⁴ + M⁴ elements (49 / 4 ≈ 14× the table's for M = 7).

    Parameters: qkv (C·3C + 3C), proj (C² + C) and the relative-position-bias
    table ((2M - 1)² × H).
    """
    _check_positive(grid_h=grid_h, grid_w=grid_w, dim=dim, heads=heads, window=window, batch=batch)
    if min(grid_h, grid_w) <= window:  # SwinTransformerBlock.__init__ in Swin's code
        window, shifted = min(grid_h, grid_w), False
    hp = math.ceil(grid_h / window) * window
    wp = math.ceil(grid_w / window) * window
    windows, m2 = (hp // window) * (wp // window), window * window
    per_window = mha_cost(m2, dim, heads, qkv_bias=qkv_bias)
    stacked = _batched(windows * per_window, batch)  # all windows share one set of weights
    scores = batch * windows * heads * m2 * m2
    elementwise = {**stacked.elementwise, "position bias": RELATIVE_FLOPS_PER_SCORE * scores}
    if shifted:
        elementwise["mask"] = scores
    table = (2 * window - 1) ** 2
    if dense:
        memory = {"relative bias": heads * m2 * m2, "relative index": m2 * m2}
    else:
        memory = {"relative values": heads * table, "relative index": table + 2 * m2}
    return Cost(
        terms=stacked.terms,
        params=per_window.params + table * heads,
        elementwise=elementwise,
        memory=memory,
    )
