"""Seeing attention: capture, the :class:`AttentionMaps` data contract, and renderers.

Data and rendering are apart: `record_attention` captures per-layer (B, H, N, S)
probabilities from any model; :class:`AttentionMaps` holds (L, H, N, S) for one
example; :func:`head_view` turns it into a self-contained HTML page,
:func:`show` into the same view inside a Jupyter notebook (recordings and maps also
display themselves there) and :func:`model_view` into a matplotlib figure (layers × heads
heatmaps). :func:`plot_block_map` draws which blocks a structured mask lets a kernel skip;
:func:`plot_masks`, :func:`plot_positional_encoding` and :func:`plot_transformer` draw the
tutorials' teaching figures (masks beside their weights, the position table, the
encoder-decoder data flow with its shapes).
"""

from attnkit.viz.head_view import head_view, write_html
from attnkit.viz.maps import AttentionMaps
from attnkit.viz.notebook import HeadViewHTML, show
from attnkit.viz.record import AttentionRecord, record_attention

__all__ = [
    "AttentionMaps",
    "AttentionRecord",
    "HeadViewHTML",
    "head_view",
    "model_view",
    "plot_block_map",
    "plot_masks",
    "plot_positional_encoding",
    "plot_transformer",
    "record_attention",
    "save_model_view",
    "show",
    "write_html",
]


def __getattr__(name: str):
    # matplotlib costs ~1 s to import: load the PNG renderer only when asked for.
    if name in {"model_view", "save_model_view"}:
        from attnkit.viz import figures

        return getattr(figures, name)
    if name == "plot_block_map":
        from attnkit.viz.block_map import plot_block_map

        return plot_block_map
    if name in {"plot_masks", "plot_positional_encoding", "plot_transformer"}:
        from attnkit.viz import diagrams

        return getattr(diagrams, name)
    raise AttributeError(f"module 'attnkit.viz' has no attribute {name!r}")
