"""The head view inside Jupyter: `show` and the `_repr_html_` of recorded attention.

A notebook page holds many outputs in one document, so a view here is an HTML fragment,
not a page: one ``<div>`` with an id of its own (``akv-`` + 12 random hex digits), a
``<style>`` whose every rule starts with that id, its data in a JSON ``<script>`` and the
head view program, which draws inside that ``<div>`` only (the single global name is
``window.attnkitViz``). Several views on one page, or the same cell run twice, never
touch each other. Nothing is loaded from anywhere: it works offline and from a saved
notebook once the notebook is trusted (before that, Jupyter does not run scripts of
outputs and the view says so in one line).

The data is the one of :func:`attnkit.viz.head_view` (sparse, 1/255-quantised rows),
capped for notebooks: at most ``max_tokens`` queries and keys, and the embedded data kept
under ``max_bytes`` by lowering ``top_k``; what was cropped is stated under the view.
"""

from __future__ import annotations

import html
import uuid
from dataclasses import dataclass
from typing import Literal

from attnkit.viz.head_view import _asset, _check, _encode, _json_for_script
from attnkit.viz.maps import REPR_HTML, AttentionMaps
from attnkit.viz.record import AttentionRecord, _maps_of

__all__ = ["HeadViewHTML", "show"]

# Defaults for notebooks: smaller than the standalone page's (512 tokens), because a
# notebook keeps every output in its .ipynb file.
MAX_TOKENS = 128
MAX_BYTES = 1_000_000


@dataclass(frozen=True)
class HeadViewHTML:
    """An interactive head view that Jupyter displays inline (its ``_repr_html_``).

    Attributes:
        html: the self-contained HTML fragment (``<div id=view_id>...</div>``).
        view_id: the id of its ``<div>``, unique per call.
    """

    html: str
    view_id: str

    def _repr_html_(self) -> str:
        return self.html

    def __repr__(self) -> str:
        return f"HeadViewHTML(view_id={self.view_id!r}, {len(self.html):,} characters of HTML)"


def show(
    attn: AttentionMaps | AttentionRecord,
    tokens: list[str] | None = None,
    *,
    layer: int = -1,
    head: int | Literal["mean"] | None = "mean",
    title: str | None = None,
    max_tokens: int = MAX_TOKENS,
    top_k: int = 10,
    threshold: float = 0.02,
    max_bytes: int = MAX_BYTES,
) -> HeadViewHTML:
    """The head view of `attn` for a notebook cell: display the result (last in a cell).

    Args:
        attn: maps of one example (L, H, N, S), or a recording: then its first example,
            every recorded module as a layer (`AttentionRecord.to_maps` picks other
            examples, a prefix or cross-attention key tokens).
        tokens: the N token strings, only with a recording (default "0", "1", ...).
        layer: layer shown first (negative counts from the end; default the last).
        head: head shown first, an int or "mean" (mean of heads; also None).
        title: heading of the view (default "Attention head view").
        max_tokens: queries and keys beyond the first ``max_tokens`` are cropped.
        top_k: per query row, at most this many weights are stored and drawn (1..255).
        threshold: weights below this are dropped; in [0, 1).
        max_bytes: cap on the embedded weights (base64 characters). When the data would be
            larger, ``top_k`` is lowered until it fits (stated under the view); ValueError
            if one weight per query row is already too much (select fewer layers with
            ``AttentionMaps.select`` or lower ``max_tokens``).

    Bad arguments raise ValueError naming them, as :func:`attnkit.viz.head_view` does.
    """
    if isinstance(attn, AttentionRecord):
        maps = attn.to_maps(tokens)
    elif isinstance(attn, AttentionMaps):
        if tokens is not None:
            raise ValueError("tokens: AttentionMaps carry their own tokens; pass tokens=None")
        maps = attn
    else:
        raise ValueError(
            f"attn: expected AttentionMaps or AttentionRecord, got {type(attn).__name__}"
        )
    if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 1:
        raise ValueError(f"max_bytes: expected a positive int, got {max_bytes!r}")
    layer_index, head_index = _check(maps, layer, head, max_tokens, top_k, threshold)
    payload = _fit(maps, max_tokens=max_tokens, top_k=top_k, threshold=threshold, cap=max_bytes)
    payload["initialLayer"] = layer_index
    payload["initialHead"] = head_index
    view_id = "akv-" + uuid.uuid4().hex[:12]
    return HeadViewHTML(_fragment(view_id, title or "Attention head view", payload), view_id)


def record_html(record: AttentionRecord) -> str:
    """`AttentionRecord._repr_html_`: example 0 of the modules whose maps share the shape of
    the first recorded one (the others are named under the view)."""
    first = record.calls[record.names[0]][-1].shape
    names = [n for n in record.names if record.calls[n][-1].shape == first]
    try:
        maps = _maps_of(record, names, None, None, 0)
        view = show(maps, title="Recorded attention (example 0)")
    except ValueError as e:  # e.g. NaN in the maps: say so instead of a traceback
        return f"<p>AttentionRecord: not shown inline ({html.escape(str(e))})</p>"
    left = [n for n in record.names if n not in names]
    if not left:
        return view.html
    note = (
        f"Not shown (maps of another shape): {', '.join(left)}. Pick them with "
        f"attnkit.viz.show(record.to_maps(prefix=...))."
    )
    # The note goes into the view's own notes list, as plain text.
    return view.html.replace(
        '<ul class="ak-notes-list">', f'<ul class="ak-notes-list"><li>{html.escape(note)}</li>', 1
    )


def maps_html(maps: AttentionMaps) -> str:
    """`AttentionMaps._repr_html_`: the last layer, mean of heads; a one-line message if
    the maps are too large to embed."""
    try:
        return show(maps, max_bytes=MAX_BYTES).html
    except ValueError as e:
        return f"<p>AttentionMaps {tuple(maps.shape)}: not shown inline ({html.escape(str(e))})</p>"


REPR_HTML["AttentionMaps"] = maps_html
REPR_HTML["AttentionRecord"] = record_html


def _size(payload: dict) -> int:
    return sum(len(payload[key]) for key in ("counts", "keys", "weights"))


def _fit(maps: AttentionMaps, *, max_tokens: int, top_k: int, threshold: float, cap: int) -> dict:
    """`_encode`'s payload with top_k lowered until the embedded data is at most `cap`."""
    payload = _encode(maps, max_tokens=max_tokens, top_k=top_k, threshold=threshold)
    first = k = payload["topK"]  # top_k, or the number of keys if that is smaller
    while _size(payload) > cap and k > 1:
        # Entries dominate the size (3 bytes each, 1 count byte per row): scale k down,
        # by at least one, and encode again.
        k = max(1, min(k - 1, int(k * cap / _size(payload))))
        payload = _encode(maps, max_tokens=max_tokens, top_k=k, threshold=threshold)
    if _size(payload) > cap:
        raise ValueError(
            f"max_bytes: maps of shape {maps.shape} need {_size(payload):,} bytes even with "
            f"one weight per query row, over max_bytes={cap:,}; show fewer layers "
            f"(maps.select(layers=...)) or fewer tokens (max_tokens=...)"
        )
    if k < first:
        payload["notes"].insert(
            0, f"top_k lowered from {first} to {k} to keep the embedded data under {cap:,} bytes."
        )
    return payload


def _fragment(view_id: str, title: str, payload: dict) -> str:
    L, H, N, S = payload["shape"]
    subtitle = f"{N} queries × {S} keys · {L} layers × {H} heads"
    css = _asset("head_view_nb.css").replace(".ak-nb", f"#{view_id}.ak-nb")
    # Find this view's <div> from the running script (robust to a copied output with the
    # same id); environments that run scripts elsewhere (eval) fall back to the id.
    boot = (
        "(function () { var s = document.currentScript, p = s && s.parentElement; "
        "window.attnkitViz.headView(p && p.classList.contains('ak-nb') ? p : "
        f"document.getElementById('{view_id}')); }})();"
    )
    return f"""<div id="{view_id}" class="ak-nb" data-attnkit="head-view">
<style>
{css}</style>
<div class="ak-header">
  <p class="ak-title">{html.escape(title)}</p>
  <p class="ak-sub">{html.escape(subtitle)}</p>
  <div class="ak-controls">
    <label>Layer <select class="ak-layer" aria-label="layer"></select></label>
    <label>Head <select class="ak-head" aria-label="head"></select></label>
    <span class="ak-legend"><span class="ak-swatch"></span>
      <span>line opacity = attention weight (0 → 1)</span></span>
  </div>
  <p class="ak-hint">Hover a query on the left to see only its row, a key on the right to
  see only its column. <span class="ak-status"></span></p>
</div>
<p class="ak-nojs">Interactive attention view: it needs JavaScript. Run the cell, or trust
the notebook, to see it.</p>
<div class="ak-scroll">
  <div class="ak-grid ak-colheads"><div>queries</div><div></div><div>keys</div></div>
  <div class="ak-grid">
    <div class="ak-col ak-left ak-queries"></div>
    <svg class="ak-lines ak-svg" role="img" aria-label="attention lines">
      <g class="ak-all"></g><g class="ak-focus"></g>
    </svg>
    <div class="ak-col ak-right ak-keys"></div>
  </div>
</div>
<div class="ak-notes"><ul class="ak-notes-list"></ul></div>
<script type="application/json" class="ak-data">{_json_for_script(payload)}</script>
<script>
{_asset("head_view.js")}{boot}
</script>
</div>
"""
