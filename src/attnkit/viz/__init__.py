"""Seeing attention: capture, the :class:`AttentionMaps` data contract, and renderers.

Data and rendering are apart: `record_attention` captures per-layer (B, H, N, S)
probabilities from any model; :class:`AttentionMaps` holds (L, H, N, S) for one
example; :func:`head_view` turns it into a self-contained HTML page,
:func:`show` into the same view inside a Jupyter notebook (recordings and maps also
display themselves there) and :func:`model_view` into a matplotlib figure (layers × heads
heatmaps), :func:`layer_view` into one layer's heads large enough to read and
:func:`draw_head_lines` into the head view as a still picture. :func:`plot_block_map` draws
which blocks a structured mask lets a kernel skip.
The teaching figures of the tutorials draw a page's own numbers:
:func:`attention_steps_figure` (the six steps of self-attention), :func:`attention_row_figure`
(one query's scores, weights and weighted sum), :func:`multi_head_figure` (split, attend per
head, concatenate, project), :func:`soft_split_figure` (patches / T2T's soft split) and
:func:`channel_spatial_figure` (channel and spatial gates next to self-attention weights).
:func:`plot_masks` (masks beside their weights), :func:`plot_positional_encoding` (the
position table) and :func:`plot_transformer` (the encoder-decoder data flow with its shapes).
The views label tokens with :func:`token_labels` ("Ġcat" is shown as "cat"). The teaching figures
take ``lang="en"`` or ``lang="zh"`` (Chinese labels); :func:`use_cjk_font` makes matplotlib draw
CJK text with the CJK font of the ``[viz]`` extra.
"""

from attnkit.viz.fonts import use_cjk_font
from attnkit.viz.head_view import head_view, write_html
from attnkit.viz.labels import token_labels
from attnkit.viz.maps import AttentionMaps
from attnkit.viz.notebook import HeadViewHTML, show
from attnkit.viz.record import AttentionRecord, record_attention

# the teaching figures, by the module that draws them (matplotlib loads on first use)
_LESSONS = {
    "attention_row_figure": "lessons",
    "attention_steps_figure": "lessons",
    "multi_head_figure": "lessons",
    "channel_spatial_figure": "lessons_vision",
    "soft_split_figure": "lessons_vision",
}

__all__ = [
    "AttentionMaps",
    "AttentionRecord",
    "HeadViewHTML",
    "attention_row_figure",
    "attention_steps_figure",
    "channel_spatial_figure",
    "draw_head_lines",
    "head_view",
    "layer_view",
    "model_view",
    "multi_head_figure",
    "plot_block_map",
    "plot_masks",
    "plot_positional_encoding",
    "plot_transformer",
    "record_attention",
    "save_model_view",
    "show",
    "soft_split_figure",
    "token_labels",
    "use_cjk_font",
    "write_html",
]


def __getattr__(name: str):
    # matplotlib costs ~1 s to import: load the PNG renderer only when asked for.
    if name in {"model_view", "save_model_view"}:
        from attnkit.viz import figures

        return getattr(figures, name)
    if name in {"draw_head_lines", "layer_view"}:
        from attnkit.viz import lines

        return getattr(lines, name)
    if name == "plot_block_map":
        from attnkit.viz.block_map import plot_block_map

        return plot_block_map
    if name in _LESSONS:
        import importlib

        return getattr(importlib.import_module(f"attnkit.viz.{_LESSONS[name]}"), name)
    if name in {"plot_masks", "plot_positional_encoding", "plot_transformer"}:
        from attnkit.viz import diagrams

        return getattr(diagrams, name)
    raise AttributeError(f"module 'attnkit.viz' has no attribute {name!r}")
