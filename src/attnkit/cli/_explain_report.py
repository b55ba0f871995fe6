"""The table `attnkit explain` prints, and the head it names (where the head view opens).

Columns are padded by display width, not by character count: a CJK character takes two
terminal cells (Unicode's East Asian Width W and F), so `str.ljust` would misalign a table
of Chinese tokens.

Dimensions: L' layers and H' heads shown, N tokens.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

__all__ = ["SPECIAL", "UNKNOWN", "display_width", "ljust", "ranked", "report", "strongest"]

SPECIAL = frozenset({"[CLS]", "[SEP]", "[PAD]"})
UNKNOWN = frozenset({"[UNK]", "<unk>"})


def display_width(text: str) -> int:
    """Terminal cells `text` takes: 2 for wide and full-width characters, 0 for combining
    marks, 1 otherwise."""
    width = 0
    for c in text:
        if unicodedata.combining(c):
            continue
        width += 2 if unicodedata.east_asian_width(c) in ("W", "F") else 1
    return width


def ljust(text: str, width: int) -> str:
    """`text` padded with spaces to `width` terminal cells (unchanged when wider)."""
    return text + " " * max(0, width - display_width(text))


def ranked(
    row: torch.Tensor, tokens: Sequence[str], k: int, skip: Sequence[int] = ()
) -> list[tuple[str, float]]:
    """The `k` largest weights of `row` (S,) as (token, weight). Positions in `skip` are
    dropped and the rest renormalised to sum to 1 (when anything is left)."""
    w = row.clone()
    if skip:
        w[list(skip)] = 0.0
        total = float(w.sum())
        w = w / total if total > 0 else w
    values, index = w.topk(min(k, w.numel()))
    return [(tokens[int(i)], float(v)) for v, i in zip(values, index, strict=True)]


def _cells(items: list[tuple[str, float]]) -> str:
    return "  ".join(f"{t} {w:.2f}" for t, w in items)


def _skipped(tokens: Sequence[str], focus: int, special: Sequence[bool] | None) -> list[int]:
    special = [t in SPECIAL for t in tokens] if special is None else special
    unk = {i for i, t in enumerate(tokens) if t in UNKNOWN}
    return sorted({i for i, s in enumerate(special) if s} | unk | {focus})


def strongest(
    maps: torch.Tensor, tokens: Sequence[str], focus: int, special: Sequence[bool] | None = None
) -> tuple[int, int] | None:
    """(layer, head) positions in maps (L', H', N, N) of the head of the last layer shown that
    puts the most weight of the focus token on one word (the head the table names and the
    head view opens on); None when the text has no word besides the focus."""
    found = _strongest_head(maps[-1:, :, focus], _skipped(tokens, focus, special))
    return None if found is None else (maps.shape[0] - 1, found[2])


def report(
    maps,
    tokens: list[str],
    focus: int,
    layers: list[int],
    heads: list[int],
    k: int,
    special: Sequence[bool] | None = None,
):
    """The table (a list of lines) for maps (L', H', N, N) of the selected layers and heads.
    `special`: N flags of tokens left out of the top words (default: [CLS]/[SEP]/[PAD]);
    the focus token and unknown-token pieces are left out too."""
    skip = _skipped(tokens, focus, special)
    rows = maps[:, :, focus]  # (L', H', N): the focus token's attention
    name = tokens[focus]
    cells = [[_cells(ranked(r, tokens, k)), _cells(ranked(r, tokens, k, skip))]
             for r in rows.mean(1)]  # fmt: skip
    last = len(layers) - 1
    head_cells = [[_cells(ranked(r, tokens, 1)), _cells(ranked(r, tokens, 1, skip))]
                  for r in rows[last]]  # fmt: skip
    width = max(40, *(display_width(c[0]) for c in cells + head_cells))
    lines = [f"where {name!r} (token {focus}) attends; mean over heads {_span(heads)}", ""]
    lines.append(
        f"{'layer':>5}  {ljust('top tokens', width)}  top words (no special tokens/itself)"
    )
    lines += [f"{layer:>5}  {ljust(raw, width)}  {words}" for layer, (raw, words) in
              zip(layers, cells, strict=True)]  # fmt: skip
    lines += ["", f"{'head':>5}  {ljust(f'top token (layer {layers[last]})', width)}  top word"]
    lines += [f"{head:>5}  {ljust(raw, width)}  {words}" for head, (raw, words) in
              zip(heads, head_cells, strict=True)]  # fmt: skip
    lines.append("")
    in_last = _strongest_head(rows[last:], skip)
    overall = _strongest_head(rows, skip)
    if in_last is not None:
        weight, _, hi, j = in_last
        lines.append(
            f"layer {layers[last]}: head {heads[hi]} puts the most weight of {name!r} on one "
            f"word: {weight:.2f} on {tokens[j]!r} (the head view opens there)"
        )
    if overall is not None and overall != in_last:
        weight, li, hi, j = overall
        where = {focus - 1: " (the previous token)", focus + 1: " (the next token)"}.get(j, "")
        lines.append(
            f"all layers shown: layer {layers[li]} head {heads[hi]} puts the most: "
            f"{weight:.2f} on {tokens[j]!r}{where}"
        )
    return lines


def _strongest_head(rows: torch.Tensor, skip: Sequence[int]) -> tuple[float, int, int, int] | None:
    """(weight, layer, head, token) of the head whose top word (raw weight, `skip` left
    out) is largest, over rows (L', H', N); None if only skipped tokens exist."""
    import torch

    words = torch.ones(rows.shape[-1], dtype=torch.bool)  # (N,)
    words[list(skip)] = False
    if not bool(words.any()):
        return None
    top, where = rows.masked_fill(~words, -1.0).max(-1)  # (L', H') each
    li, hi = divmod(int(top.argmax()), rows.shape[1])
    return float(top[li, hi]), li, hi, int(where[li, hi])


def _span(indices: list[int]) -> str:
    if indices == list(range(indices[0], indices[-1] + 1)):
        return f"{indices[0]}..{indices[-1]}"
    return ",".join(map(str, indices))
