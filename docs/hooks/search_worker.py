"""MkDocs hook (mkdocs.yml `hooks:`): Material's search worker tries a whole Chinese query word.

Material (9.x, integrations/search/query/segment) cuts a run of Han characters in a query into
the pieces the index holds, greedily from each position, but its loop
`for (j = i + 1; j < query.length; j++)` never tries the piece that reaches the end of the
run, so the whole word is never a piece. Wherever the word's first character is a token of
some page (jieba leaves single characters such as 掩, 键, 层 as tokens), 掩码 was searched as
掩*, 键值缓存 as 键* 值* (29 pages, the one page that says it ranked among them) and 层规范化
as 层*; the result links then asked the page to highlight `?h=掩`, the first character only.

Here the built worker's loop runs to `j <= query.length`: a query word that is a token is its
own piece (the glossary's words, made tokens by jieba_terms.txt, find the glossary), and the
highlight is the word. A word the index does not hold is still cut into the pieces it does.
tests/docs/test_search.py models the patched worker and tests/docs/test_browser_site.py checks
the model against the real one in Chromium.
"""

from __future__ import annotations

from pathlib import Path

from mkdocs.plugins import event_priority

# the loop of `segment` in Material 9.x's minified worker, and its patched form
LOOP = "for(let o=s+1;o<t.length;o++)t.slice(s,o)in e"
PATCHED = "for(let o=s+1;o<=t.length;o++)t.slice(s,o)in e"


def patch(text: str) -> str:
    """The worker with the whole word tried; ValueError when the loop is not found once (a
    Material upgrade: look at integrations/search/query/segment again)."""
    if text.count(PATCHED) == 1:
        return text
    if text.count(LOOP) != 1:
        raise ValueError(f"search worker: expected one {LOOP!r}, found {text.count(LOOP)}")
    return text.replace(LOOP, PATCHED)


@event_priority(-200)  # after mkdocs-static-i18n has built every language
def on_post_build(config) -> None:
    workers = sorted(
        (Path(config.site_dir) / "assets" / "javascripts" / "workers").glob("search.*.js")
    )
    if not workers:
        return
    for worker in workers:
        worker.write_text(patch(worker.read_text(encoding="utf-8")), encoding="utf-8")
