"""Head view: one self-contained HTML page showing the attention of one layer and head.

Queries on the left, keys on the right, a line from query i to key j whose opacity
is the weight ``maps[l, h, i, j]``. Selectors switch layer and head (or the mean of
heads); hovering a token shows only its row (query) or column (key).

The page works offline from file:// (script, style and data are inline; a Content
Security Policy forbids any network access). To stay small and fast for long inputs
(512 tokens, 24 layers × 12 heads) the weights are stored sparsely: for each query
row, only the ``top_k`` largest weights that are at least ``threshold``, quantised to
1/255. The page states what was cropped and how much attention mass was dropped.

``lang="zh"`` gives the page a Chinese interface; tokens or a title with CJK characters get
the glyphs they use embedded as a font subset (`attnkit.viz.fonts.css_subset`, a few KB), so
the page shows them on a machine without a CJK font too.
"""

from __future__ import annotations

import base64
import html
import json
import os
from importlib import resources
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch

from attnkit._io import atomic_write_text
from attnkit.viz._lang import translate
from attnkit.viz.labels import token_labels
from attnkit.viz.maps import AttentionMaps

__all__ = ["head_view", "write_html"]

_QUANT = 255  # weights are stored as round(w * 255) in one byte
_MAX_KEYS = 65535  # key indices are stored as uint16

# The only resource the page may use is itself: inline script/style, data: images.
_CSP = (
    "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
    "img-src data:; font-src data:"
)

# The interface in each language (`lang`); the JavaScript reads `ui` from the payload.
_UI = {
    "en": {
        "title": "Attention head view",
        "layer": "Layer",
        "head": "Head",
        "legend": "line opacity = attention weight (0 → 1)",
        "hint": "Hover (or focus) a query on the left to see only its row, a key on the right "
        "to see only its column; click a query to keep it shown.",
        "queries": "queries",
        "keys": "keys",
        "sub": "{N} queries × {S} keys · {L} layers × {H} heads",
        "mean": "mean of heads",
        "headN": "head {h}",
        "query": "query",
        "key": "key",
        "lines": "lines",
        "crop": "Cropped to the first {n} of {N} queries and {s} of {S} keys "
        "(max_tokens={max_tokens}); weights to cropped keys are not drawn.",
        "kept": "Stored and drawn per query: the {k} strongest weights that are ≥ {threshold}, "
        "quantised to 1/{quant}. They carry {pct:.1f}% of the attention mass of the individual "
        "heads; {dropped} smaller non-zero weights were dropped.",
        "meannote": "“Mean of heads” averages the full maps of all {H} heads before anything "
        "is dropped.",
    },
    "zh": {
        "title": "注意力 head view",
        "layer": "层",
        "head": "头",
        "legend": "线的不透明度 = 注意力权重（0 → 1）",
        "hint": "把鼠标移到（或用键盘聚焦）左边的查询上，只看它那一行；"
        "移到右边的键上，只看它那一列；点击一个查询，让它一直显示。",
        "queries": "查询",
        "keys": "键",
        "sub": "{N} 个查询 × {S} 个键 · {L} 层 × {H} 个头",
        "mean": "各头的平均",
        "headN": "{h} 号头",
        "query": "查询",
        "key": "键",
        "lines": "条线",
        "crop": "只保留前 {n}/{N} 个查询和前 {s}/{S} 个键（max_tokens={max_tokens}）；"
        "指向被裁掉的键的权重不画。",
        "kept": "每个查询只存储并画出 ≥ {threshold} 的最强 {k} 个权重，量化到 1/{quant}。"
        "它们占各个头注意力总量的 {pct:.1f}%；另有 {dropped} 个更小的非零权重被丢弃。",
        "meannote": "“各头的平均”是在丢弃任何权重之前，对全部 {H} 个头的完整注意力图取平均。",
    },
}


def head_view(
    maps: AttentionMaps,
    *,
    layer: int = 0,
    head: int | Literal["mean"] | None = None,
    query: int | None = None,
    title: str | None = None,
    max_tokens: int = 512,
    top_k: int = 10,
    threshold: float = 0.02,
    lang: Literal["en", "zh"] = "en",
) -> str:
    """Render ``maps`` (L, H, N, S) as one self-contained HTML document (returned as str).

    Args:
        maps: attention of one example, (L, H, N, S).
        layer: layer shown first (negative counts from the end).
        head: head shown first: an int, or "mean" for the mean of heads; None means "mean".
        query: the query shown first, alone (as if clicked), e.g. the word a page is about;
            None draws every query's lines. Negative counts from the end.
        title: page heading (default "Attention head view").
        max_tokens: queries and keys beyond the first ``max_tokens`` are cropped (noted
            in the page). At most 65535.
        top_k: per query row, at most this many weights are stored and drawn (1..255).
        threshold: weights below this are dropped (lines fainter than this are invisible
            anyway); in [0, 1).
        lang: language of the interface, "en" or "zh".

    The mean of heads is computed from the full (L, H, N, S) maps before anything is
    dropped. Write the result with :func:`write_html`.
    """
    layer_index, head_index = _check(maps, layer, head, max_tokens, top_k, threshold)
    if lang not in _UI:
        raise ValueError(f"lang: expected one of {sorted(_UI)}, got {lang!r}")
    query_index = _check_query(query, min(maps.shape[2], max_tokens))
    payload = _encode(maps, max_tokens=max_tokens, top_k=top_k, threshold=threshold, lang=lang)
    payload["initialLayer"] = layer_index
    payload["initialHead"] = head_index
    payload["initialQuery"] = query_index
    return _page(title or _UI[lang]["title"], payload, lang)


def _check_query(query: int | None, n: int) -> int | None:
    """`query` as an index into the n shown queries (None stays None)."""
    if query is None:
        return None
    if isinstance(query, bool) or not isinstance(query, int) or not -n <= query < n:
        raise ValueError(f"query: expected None or an int in [{-n}, {n}) (the shown queries), "
                         f"got {query!r}")  # fmt: skip
    return query % n


def _check(
    maps: AttentionMaps,
    layer: int,
    head: int | Literal["mean"] | None,
    max_tokens: int,
    top_k: int,
    threshold: float,
) -> tuple[int, int]:
    """Validate the arguments of the head view; return (layer, head) as indices, where
    head == H stands for the mean of heads."""
    if not isinstance(maps, AttentionMaps):
        raise ValueError(f"maps: expected AttentionMaps, got {type(maps).__name__}")
    L, H = maps.shape[:2]
    if isinstance(layer, bool) or not isinstance(layer, int) or not -L <= layer < L:
        raise ValueError(f"layer: expected an int in [{-L}, {L}) for maps of shape {maps.shape}")
    if head is None or head == "mean":
        head_index = H
    elif isinstance(head, int) and not isinstance(head, bool) and -H <= head < H:
        head_index = head % H
    else:
        raise ValueError(
            f"head: expected an int in [{-H}, {H}), 'mean' or None for maps of shape "
            f"{maps.shape}, got {head!r}"
        )
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int):
        raise ValueError(f"max_tokens: expected an int, got {type(max_tokens).__name__}")
    if not 1 <= max_tokens <= _MAX_KEYS:
        raise ValueError(f"max_tokens: expected 1..{_MAX_KEYS}, got {max_tokens}")
    if isinstance(top_k, bool) or not isinstance(top_k, int) or not 1 <= top_k <= 255:
        raise ValueError(f"top_k: expected an int in 1..255, got {top_k!r}")
    if (
        isinstance(threshold, bool)
        or not isinstance(threshold, (int, float))
        or not 0 <= threshold < 1
    ):
        raise ValueError(f"threshold: expected a float in [0, 1), got {threshold!r}")
    return layer % L, head_index


def write_html(path: str | os.PathLike[str], html_text: str) -> Path:
    """Write an HTML document (e.g. from :func:`head_view`) atomically; return the path."""
    return atomic_write_text(path, html_text)


def _encode(
    maps: AttentionMaps, *, max_tokens: int, top_k: int, threshold: float, lang: str = "en"
) -> dict:
    """Sparse, quantised payload for the page.

    For every layer l and "head" h in 0..H (h == H is the mean of heads) and query i,
    ``counts[l, h, i]`` entries follow in ``keys`` (uint16 little-endian) and
    ``weights`` (uint8, w * 255), strongest first.
    """
    L, H, N, S = maps.shape
    n, s = min(N, max_tokens), min(S, max_tokens)
    k = min(top_k, s)
    counts, keys, weights = [], [], []
    kept_mass = total_mass = 0.0
    dropped = 0
    for l in range(L):
        heads = maps.maps[l]  # (H, N, S)
        total_mass += float(heads.sum(dtype=torch.float64))
        mean = heads.mean(dim=0, keepdim=True)[:, :n, :s]  # (1, n, s), from the full maps
        heads = heads[:, :n, :s]  # (H, n, s)
        top = [t.topk(k, dim=-1) for t in (heads, mean)]  # values descending
        vals = torch.cat([top[0].values, top[1].values])  # (H + 1, n, k): heads, then mean
        idx = torch.cat([top[0].indices, top[1].indices])  # (H + 1, n, k)
        keep = vals >= max(threshold, 0.5 / _QUANT)  # quantising to 0 would drop it anyway
        kept_mass += float((vals * keep)[:H].sum(dtype=torch.float64))
        dropped += int(torch.count_nonzero(heads)) - int(keep[:H].sum())
        counts.append(keep.sum(dim=-1).to(torch.uint8).numpy())  # (H + 1, n)
        # keep is a prefix of each row (vals descending), so the row order survives masking.
        keys.append(idx[keep].to(torch.int32).numpy().astype("<u2"))
        weights.append(torch.round(vals[keep].clamp(0, 1) * _QUANT).to(torch.uint8).numpy())

    ui, notes = _UI[lang], []
    if n < N or s < S:
        notes.append(ui["crop"].format(n=n, N=N, s=s, S=S, max_tokens=max_tokens))
    pct = 100.0 * kept_mass / total_mass if total_mass > 0 else 100.0
    notes.append(
        ui["kept"].format(k=k, threshold=f"{threshold:g}", quant=_QUANT, pct=pct, dropped=dropped)
    )
    notes.append(ui["meannote"].format(H=H))
    return {
        "ui": {key: ui[key] for key in ("mean", "headN", "query", "key", "lines")},
        "tokens": token_labels(maps.tokens)[:n],
        "keyTokens": token_labels(maps.key_tokens or maps.tokens)[:s],
        "layerNames": [translate(name, lang) for name in maps.names],
        "numHeads": H,
        "shape": [L, H, N, S],
        "topK": k,
        "threshold": threshold,
        "quant": _QUANT,
        "counts": _b64(np.concatenate([c.ravel() for c in counts])),
        "keys": _b64(np.concatenate(keys)),
        "weights": _b64(np.concatenate(weights)),
        "notes": notes,
    }


def _b64(a: np.ndarray) -> str:
    return base64.b64encode(a.tobytes()).decode("ascii")


def _asset(name: str) -> str:
    return resources.files("attnkit.viz").joinpath(name).read_text(encoding="utf-8")


def _json_for_script(data: Any) -> str:
    """JSON that is safe inside <script>: no "<", ">" or "&" can end or confuse the element."""
    text = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


_FONT_SLOT = "/* attnkit: fonts */"


def _font_css(page: str) -> str:
    """The CJK fallback fonts, and the glyphs of every CJK character of `page` (title, tokens,
    interface, notes) embedded as a subset."""
    from attnkit.viz.fonts import CJK_CSS_FAMILIES, css_subset

    face = css_subset(page) or ""
    # The embedded subset comes first: it has CJK glyphs only, so Latin text falls through to
    # the next family; after the system fonts, Chromium without a system CJK font drew boxes
    # for the page's first CJK text (the subtitle, the layer label).
    return (
        f'{face}\nbody {{ font-family: "attnkit CJK", system-ui, -apple-system, "Segoe UI", '
        f"Roboto, {CJK_CSS_FAMILIES}, sans-serif; }}\n.ak-tok {{ font-family: "
        f'"attnkit CJK", ui-monospace, SFMono-Regular, Menlo, Consolas, {CJK_CSS_FAMILIES}, '
        "monospace; }\n"
    )


def _page(title: str, payload: dict, lang: str = "en") -> str:
    L, H, N, S = payload["shape"]
    ui = _UI[lang]
    subtitle = ui["sub"].format(N=N, S=S, L=L, H=H)
    page = f"""<!DOCTYPE html>
<html lang="{lang}">
<head>
<meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="{_CSP}">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="generator" content="attnkit.viz.head_view">
<title>{html.escape(title)}</title>
<style>
{_asset("head_view.css")}
{_FONT_SLOT}</style>
</head>
<body>
<header class="ak-header">
  <h1>{html.escape(title)}</h1>
  <p class="ak-sub">{html.escape(subtitle)}</p>
  <div class="ak-controls">
    <label>{ui["layer"]} <select id="ak-layer" class="ak-layer" aria-label="layer"></select></label>
    <label>{ui["head"]} <select id="ak-head" class="ak-head" aria-label="head"></select></label>
    <span class="ak-legend" aria-label="legend">
      <span class="ak-swatch" id="ak-swatch"></span>
      <span>{ui["legend"]}</span>
    </span>
  </div>
  <p class="ak-hint">{ui["hint"]} <span id="ak-status" class="ak-status"></span></p>
</header>
<main class="ak-scroll">
  <div class="ak-grid ak-colheads">
    <div>{ui["queries"]}</div><div></div><div>{ui["keys"]}</div>
  </div>
  <div class="ak-grid">
    <div class="ak-col ak-left ak-queries" id="ak-queries"></div>
    <svg class="ak-lines ak-svg" id="ak-svg" role="img" aria-label="attention lines">
      <g id="ak-all" class="ak-all"></g><g id="ak-focus" class="ak-focus"></g>
    </svg>
    <div class="ak-col ak-right ak-keys" id="ak-keys"></div>
  </div>
</main>
<footer class="ak-notes"><ul id="ak-notes" class="ak-notes-list"></ul></footer>
<script type="application/json" id="ak-data">{_json_for_script(payload)}</script>
<script>
{_asset("head_view.js")}
window.attnkitViz.headView(document.body);
</script>
</body>
</html>
"""
    return page.replace(_FONT_SLOT, _font_css(page), 1)
