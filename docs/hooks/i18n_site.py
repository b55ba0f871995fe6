"""MkDocs hooks (mkdocs.yml `hooks:`) that give each language of the site its own search.

mkdocs-static-i18n builds the Chinese pages after the English ones and merges both languages'
entries into the one index Material reads (search/search_index.json, relative to `base`), so
a Chinese query also lists English pages and the index is tokenised with the English
separator. Here, once the whole site is built:

- each language gets its own index (search/search_index.json for English,
  zh/search/search_index.json for Chinese), with that language's lunr settings;
- every Chinese page says `base` = the zh/ root in its `__config`, so Material loads the zh
  index and resolves the zh index's locations (written relative to zh/) there;
- the head's `<link rel="alternate" hreflang>` tags are dropped: Material fetches
  `sitemap.xml` next to every such link (the i18n plugin points them at the page's own
  twin, so every page asked for two missing /…/page/sitemap.xml), and relative hreflang links
  mean nothing to a search engine anyway. The language selector keeps its page-level links;
  on the two home pages the i18n plugin writes them from the server root (`/attnkit/zh/`),
  and they are made relative, so the site works wherever it is served (or opened from disk);
- the sitemap (mkdocs writes one for both languages, each page with its `hreflang`
  alternates) gets a Chinese twin, zh/sitemap.xml, with the Chinese pages alone.

Chinese text is segmented into words by Material's search plugin when jieba is installed
(the docs extra); TERMS adds the words of our glossary that jieba's dictionary lacks.
"""

from __future__ import annotations

import json
import posixpath
import re
from pathlib import Path
from urllib.parse import urlsplit

from mkdocs.plugins import event_priority

HERE = Path(__file__).resolve().parent
TERMS = HERE / "jieba_terms.txt"
DEFAULT = "en"
# Material's own search settings for each language (material/templates/partials/languages/
# en.html, zh.html): Chinese words are separated by the zero-width spaces of the segmentation
# and keep every token (the zh stemmer is the identity), English drops stop words.
SEARCH = {
    "en": {"lang": ["en"], "separator": r"[\s\-]+", "pipeline": ["stopWordFilter"]},
    "zh": {
        "lang": ["zh"],
        "separator": r"[\s\u200b\u3000\-、。，．？！；]+",
        "pipeline": ["stemmer"],
    },
}
_CONFIG = re.compile(r'(<script id="__config" type="application/json">)(.*?)(</script>)', re.S)
_ALTERNATE = re.compile(r'[ \t]*<link rel="alternate" href="[^"]*" hreflang="[^"]*">\n?')
_SELECT = re.compile(r'(<a href=")(/[^"]*)(" hreflang="[^"]*" class="md-select__link")')
_URL = re.compile(r"[ \t]*<url>.*?</url>\n?", re.S)


def on_config(config):
    try:
        import jieba
    except ImportError:  # Chinese search then matches whole phrases only
        return config
    jieba.setLogLevel("WARNING")
    jieba.load_userdict(str(TERMS))
    return config


def _language(url: str) -> str:
    """The language of a page URL or search location: en at the root, others under lang/."""
    return next((lang for lang in SEARCH if url.startswith(f"{lang}/")), DEFAULT)


def _relative_selector(output: str, page, config) -> str:
    """The language selector's links written from the server root (`/attnkit/zh/`, on the home
    pages), relative to the page instead."""
    root = urlsplit(config.site_url or "/").path or "/"

    def relative(match: re.Match) -> str:
        target = match.group(2)
        if not target.startswith(root):
            return match.group(0)
        page_dir = posixpath.join(root, page.url)
        link = posixpath.relpath(target, page_dir) if target != page_dir else "."
        return match.group(1) + link.rstrip("/") + "/" + match.group(3)

    return _SELECT.sub(relative, output)


def on_post_page(output: str, page, config) -> str:
    output = _relative_selector(_ALTERNATE.sub("", output), page, config)
    lang = _language(page.url)
    if lang == DEFAULT:
        return output

    def rebase(match: re.Match) -> str:
        app = json.loads(match.group(2))
        app["base"] = posixpath.join(app["base"], lang, "")  # a folder: new URL(…, base)
        return match.group(1) + json.dumps(app) + match.group(3)

    return _CONFIG.sub(rebase, output, count=1)


@event_priority(-200)  # after mkdocs-static-i18n (-100) has written the merged index
def on_post_build(config) -> None:
    site = Path(config.site_dir)
    merged = site / "search" / "search_index.json"
    if not merged.is_file():
        return
    index = json.loads(merged.read_text(encoding="utf-8"))
    for lang, settings in SEARCH.items():
        prefix = "" if lang == DEFAULT else f"{lang}/"
        docs = []
        for doc in index["docs"]:
            location = doc["location"]
            if _language(location) != lang:
                continue
            docs.append({**doc, "location": location[len(prefix) :]})
        out = site / prefix / "search" / "search_index.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        data = {"config": {**index["config"], **settings}, "docs": docs}
        out.write_text(json.dumps(data, separators=(",", ":")), encoding="utf-8")

    _language_sitemaps(site, config.site_url)


def _language_sitemaps(site: Path, site_url: str | None) -> None:
    """zh/sitemap.xml: the <url> entries of sitemap.xml whose page is Chinese."""
    sitemap = site / "sitemap.xml"
    if not site_url or not sitemap.is_file():
        return
    text = sitemap.read_text(encoding="utf-8")
    entries = _URL.findall(text)
    head, tail = text[: text.index(entries[0])], text[text.rindex(entries[-1]) + len(entries[-1]) :]
    for lang in SEARCH:
        if lang == DEFAULT:
            continue
        base = f"<loc>{site_url.rstrip('/')}/{lang}/"
        mine = [entry for entry in entries if base in entry]
        (site / lang / "sitemap.xml").write_text(head + "".join(mine) + tail, encoding="utf-8")
