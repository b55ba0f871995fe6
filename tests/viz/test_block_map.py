"""attnkit.viz.plot_block_map: the block map drawn, and bad input refused by name."""

from __future__ import annotations

import matplotlib
import pytest
import torch

from attnkit import masks
from attnkit.viz import plot_block_map

matplotlib.use("Agg")


def test_draws_the_block_classes_and_says_what_is_computed():
    mask = masks.window(512, 128, causal=True)
    ax = plot_block_map(mask, 64)
    image = torch.as_tensor(ax.get_images()[0].get_array().data)
    assert torch.equal(image.to(torch.int8), mask.block_map(64, 64)[0, 0])
    assert "density 0.2" in ax.get_title() and "of blocks computed" in ax.get_title()
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert legend == ["empty: skipped", "partial: masked", "full: no mask"]


@pytest.mark.parametrize("n, block", [(4096, 256), (512, 64), (8, 4), (97, 7)])
def test_ticks_are_whole_block_numbers(n, block):
    """The ticks number blocks: integers inside the grid, labelled without a fraction."""
    ax = plot_block_map(masks.window(n, n // 8 + 1, causal=True), block)
    ax.figure.canvas.draw()
    blocks = -(-n // block)
    for ticks, labels, (lo, hi) in (
        (ax.get_xticks(), ax.get_xticklabels(), sorted(ax.get_xlim())),
        (ax.get_yticks(), ax.get_yticklabels(), sorted(ax.get_ylim())),
    ):
        shown = [(t, lab.get_text()) for t, lab in zip(ticks, labels, strict=True) if lo <= t <= hi]
        assert len(shown) >= 2
        for t, text in shown:
            assert t == int(t) and 0 <= t < blocks
            assert text.replace("\u2212", "-") == str(int(t)), text


def test_refuses_what_it_cannot_draw():
    with pytest.raises(ValueError, match="mask must be a StructuredMask, got Tensor"):
        plot_block_map(masks.causal(4))
    with pytest.raises(
        ValueError, match=r"batch=2, head=0 outside the mask's \(B\|1, H\|1\) = \(1, 1\)"
    ):
        plot_block_map(masks.window(8, 2), 4, batch=2)
