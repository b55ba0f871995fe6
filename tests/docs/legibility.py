"""How large a figure's text is where the site shows it (issue 37, item 3: no text under 11 px).

The site's content column is about 868 px wide: a PNG W px wide is shown at min(W, 868) px,
so every font is scaled by min(1, 868 / W). A text of s points saved at d dpi is s · d / 72
px in the PNG. `recording` measures every figure saved while a page's code runs (any
`Figure.savefig`, whatever the file name or buffer), so the figures made by attnkit's own
functions and the ones a page draws itself are checked alike.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

COLUMN_PX = 868  # the content column of the site's theme at its widest
MIN_PX = 11.0


@dataclass
class Saved:
    """One saved figure: its width in px, its smallest text, and that text's displayed px."""

    width_px: float
    text: str
    text_px: float

    @property
    def shown_px(self) -> float:
        return self.text_px * min(1.0, COLUMN_PX / self.width_px)


def smallest_text(fig, dpi: float) -> Saved:
    """The smallest visible non-empty text of `fig` saved at `dpi` (its size in PNG px)."""
    from matplotlib.text import Text

    fig.canvas.draw()  # ticks and legends exist only once drawn
    texts = [t for t in fig.findobj(Text) if t.get_visible() and t.get_text().strip()]
    texts = [t for t in texts if _inside(t, fig)]
    width = fig.get_figwidth() * dpi
    if not texts:
        return Saved(width, "", float("inf"))
    small = min(texts, key=lambda t: t.get_fontsize())
    return Saved(width, small.get_text(), small.get_fontsize() * dpi / 72)


def _inside(text, fig) -> bool:
    """Whether `text` is drawn within the figure (tick labels off the axis are not drawn)."""
    box = text.get_window_extent()
    w, h = fig.bbox.width, fig.bbox.height
    return box.x1 > 0 and box.y1 > 0 and box.x0 < w and box.y0 < h and box.width > 0


@contextlib.contextmanager
def recording() -> Iterator[list[Saved]]:
    """Measure every figure saved inside the block (Figure.savefig patched)."""
    from matplotlib.figure import Figure

    saved: list[Saved] = []
    original = Figure.savefig

    def savefig(self, fname, *args, **kwargs):
        dpi = kwargs.get("dpi")
        if dpi in (None, "figure"):
            import matplotlib as mpl

            dpi = mpl.rcParams["savefig.dpi"]
            dpi = self.dpi if dpi == "figure" else dpi
        result = original(self, fname, *args, **kwargs)
        saved.append(smallest_text(self, float(dpi)))
        return result

    Figure.savefig = savefig
    try:
        yield saved
    finally:
        Figure.savefig = original
