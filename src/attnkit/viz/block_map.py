"""The block map of a structured mask as a picture: which (query block, key block) a kernel
skips (empty), computes without a mask (full) or masks inside (partial)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from attnkit._optional import require
from attnkit.functional.structured import StructuredMask
from attnkit.viz._lang import localize
from attnkit.viz.fonts import use_cjk_font

if TYPE_CHECKING:
    from matplotlib.axes import Axes

use_cjk_font(quiet=True)  # CJK labels (also the page's own) fall back to a CJK font

__all__ = ["plot_block_map"]

_COLOURS = ("#ffffff", "#9ecae1", "#08519c")  # empty, partial, full


def plot_block_map(
    mask: StructuredMask,
    block: int = 128,
    *,
    batch: int = 0,
    head: int = 0,
    ax: Axes | None = None,
    title: str | None = None,
    legend: bool = True,
    lang: str = "en",
) -> Axes:
    """Draw `mask.block_map(block, block)` of one batch row and head on `ax` (a new figure if
    None): white = empty (skipped), light = partial (masked inside), dark = full (no mask).
    Returns the axes; the title says the density and the share of blocks computed, the legend
    (below the axes, ``legend=False`` to leave it out) what the colours mean."""
    if not isinstance(mask, StructuredMask):
        got = type(mask).__name__
        raise ValueError(f"plot_block_map: mask must be a StructuredMask, got {got}")
    plt = require("matplotlib.pyplot", "viz", "drawing a block map")
    from matplotlib.colors import ListedColormap
    from matplotlib.patches import Patch
    from matplotlib.ticker import MaxNLocator

    grid = mask.block_map(block, block)
    if not (0 <= batch < grid.shape[0] and 0 <= head < grid.shape[1]):
        raise ValueError(
            f"plot_block_map: batch={batch}, head={head} outside the mask's "
            f"(B|1, H|1) = {tuple(grid.shape[:2])}"
        )
    cells = grid[batch, head]
    if ax is None:
        _, ax = plt.subplots(figsize=(4, 4))
    ax.imshow(cells.numpy(), cmap=ListedColormap(_COLOURS), vmin=0, vmax=2,
              interpolation="nearest")  # fmt: skip
    computed = float((cells > 0).float().mean()) if cells.numel() else 0.0
    ax.set_title(title or f"{mask.describe()}\ndensity {mask.density:.3f}, "
                 f"{computed:.0%} of blocks computed", fontsize=10)  # fmt: skip
    ax.set_xlabel(f"key block ({block} keys)")
    ax.set_ylabel(f"query block ({block} queries)")
    for axis in (ax.xaxis, ax.yaxis):  # block numbers: never 2.5 of a block
        axis.set_major_locator(MaxNLocator(integer=True))
    if legend:
        names = ("empty: skipped", "partial: masked", "full: no mask")
        pairs = zip(_COLOURS, names, strict=True)
        patches = [Patch(facecolor=c, edgecolor="#888", label=n) for c, n in pairs]
        # 10 pt: 11 px or more where the site shows a 2 × 2 grid of maps (868 px wide)
        ax.legend(handles=patches, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=1,
                  fontsize=10, frameon=False, handlelength=1)  # fmt: skip
    return localize(ax, lang)
