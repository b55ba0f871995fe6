"""Site search finds Chinese words in the Chinese pages, and each language searches only itself.

The built indexes are read the way Material's search worker reads them (material/templates/
assets/javascripts/workers/search.*.js, Material 9.8): a field is split into tokens at its
HTML tags and at the index's `separator` (the build puts zero-width spaces between the words
jieba finds), lowercased and passed through the index's `pipeline`. A query's run of Han
characters is cut into the pieces the index knows (`segments`, the worker's own algorithm),
and every piece becomes a trailing-wildcard term, so a page is found when one of its tokens
starts with a piece.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.docs.test_site import build_site, built_html, english_pages

pytest.importorskip("jieba", reason="the docs extra is not installed (jieba segments Chinese)")

HAN = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff]")
TAG = re.compile(r"<[^>]*>")
# JavaScript's \s, which the worker's RegExp(separator) means (Python's differs slightly)
JS_SPACE = r"\t\n\v\f\r \u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000\ufeff"
WORDS = {  # word -> a page it must find (08: the heat maps and the coreference example)
    "掩码": "tutorials/04-masks/",
    "词元": "tutorials/01-self-attention/",
    "热力图": "tutorials/08-seeing-attention/",
    "指代消解": "tutorials/08-seeing-attention/",
}


def load_index(site: Path, lang: str) -> dict:
    return json.loads(
        (site / ("" if lang == "en" else lang) / "search" / "search_index.json").read_text()
    )


def tokens(value: str, separator: str) -> list[str]:
    split = re.compile(separator.replace(r"\s", JS_SPACE))
    return [t.lower() for part in TAG.split(value) for t in split.split(part) if t]


def page_tokens(index: dict) -> dict[str, set[str]]:
    """Page location -> the tokens of all its sections (title and text fields)."""
    config = index["config"]
    # with lang ["zh"] and pipeline ["stemmer"] the worker keeps every token as it is (lunr.zh's
    # stemmer is the identity; its trimmer and stop-word filter are removed): anything else
    # needs more of the worker modelled here
    assert config["lang"] == ["zh"] and config["pipeline"] == ["stemmer"], config
    pages: dict[str, set[str]] = {}
    for doc in index["docs"]:
        page = pages.setdefault(doc["location"].split("#")[0], set())
        for field in ("title", "text"):
            page.update(tokens(doc.get(field, ""), config["separator"]))
    return pages


def segments(word: str, vocabulary: set[str]) -> set[str]:
    """The worker's cut of a Han query into terms the index holds (its function `fe`): the
    longest known prefix at each position (never the whole word), then the pieces that
    overlap; the whole word when its first character starts no known term."""
    n = [0] * (len(word) + 1)
    for s in range(len(word)):
        for o in range(s + 1, len(word)):
            if word[s:o] in vocabulary:
                n[s] = o - s
    found: set[str] = set()
    stack = [0]
    while stack:
        o = stack.pop()
        for u in range(1, n[o]):
            if n[o + u] > n[o] - u:
                found.add(word[o : o + u])
                stack.append(o + u)
        a = o + n[o]
        if n[a] and a < len(word) - 1:
            stack.append(a)
        found.add(word[o:a])
    return {word} if "" in found else found


def search(pages: dict[str, set[str]], word: str) -> set[str]:
    """The pages Material lists for `word`: every piece is a term with a trailing wildcard,
    any term may match (lunr's default presence)."""
    assert all(HAN.match(c) for c in word)
    vocabulary = set().union(*pages.values())
    terms = segments(word, vocabulary)
    return {page for page, toks in pages.items() if any(t.startswith(tuple(terms)) for t in toks)}


@pytest.fixture(scope="module")
def site() -> Path:
    return build_site()


def test_segments_follow_the_worker():
    vocabulary = {"热", "力图", "注意力", "自", "掩码"}
    assert segments("热力图", vocabulary) == {"热"}  # only prefixes shorter than the word
    assert segments("自注意力", vocabulary) == {"自"}  # 注意力 ends the word: not tried
    assert segments("自注意力层", vocabulary) == {"自", "注意力"}
    assert segments("指代消解", vocabulary) == {"指代消解"}  # 指 starts nothing: the word
    assert segments("掩码", vocabulary) == {"掩码"}


@pytest.mark.parametrize("word", list(WORDS))
def test_chinese_words_find_their_pages(site, word):
    """jieba (with docs/hooks/jieba_terms.txt) makes the word one token wherever a page says
    it, so the search finds every such page. The worker may query a shorter piece (掩 for
    掩码, when 掩 is a token somewhere), which also finds a page or two that only say the
    piece: 18 pages for 掩码 (17 say it), 25 for 词元 (24), 4 for 热力图, 2 for 指代消解 (1)."""
    index = load_index(site, "zh")
    pages = page_tokens(index)
    saying = set()
    for doc in index["docs"]:
        if word in (doc["title"] + doc["text"]).replace("\u200b", ""):
            saying.add(doc["location"].split("#")[0])
    assert WORDS[word] in saying
    for page in saying:
        assert word in pages[page], f"{page} says {word}, but no token of it is {word}"
    found = search(pages, word)
    assert saying <= found, f"{word}: not found on {sorted(saying - found)}"


def page_titles(index: dict) -> dict[str, str]:
    """Page location -> its title as the index holds it (tags and zero-width spaces gone)."""
    return {
        d["location"]: TAG.sub("", d["title"]).replace("\u200b", "")
        for d in index["docs"]
        if "#" not in d["location"]
    }


def h1(html: str) -> str:
    heading = re.search(r"<h1[^>]*>(.*?)</h1>", html, re.S).group(1)
    return TAG.sub("", re.sub(r'<a class="headerlink".*?</a>', "", heading)).strip()


def test_each_index_holds_only_its_own_language(site):
    """One index per language: the Chinese index holds the 45 Chinese pages and no English
    one (a page's title is its Chinese <h1>), the English index the reverse."""
    pages = english_pages()
    for lang in ("en", "zh"):
        titles = page_titles(load_index(site, lang))
        expected = {}
        for page in pages:
            path = built_html(site, page, lang)
            root = site if lang == "en" else site / lang
            location = path.parent.relative_to(root).as_posix() + "/"
            expected["" if location == "./" else location] = h1(path.read_text())
        assert titles == expected, lang
    translated = [p for p in pages if HAN.search(h1(built_html(site, p, "zh").read_text()))]
    assert len(translated) >= 30  # so that the comparison tells the languages apart
