"""Seeing attention: the :class:`AttentionMaps` data contract and renderers on top of it.

Data and rendering are apart: capture produces :class:`AttentionMaps` (L, H, N, S) for
one example; :func:`head_view` turns it into a self-contained HTML page and
:func:`model_view` into a matplotlib figure (layers × heads heatmaps).
"""

from attnkit.viz.head_view import head_view, write_html
from attnkit.viz.maps import AttentionMaps
from attnkit.viz.model_view import model_view, save_model_view

__all__ = ["AttentionMaps", "head_view", "model_view", "save_model_view", "write_html"]
