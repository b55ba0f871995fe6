"""Site search finds Chinese words in the Chinese pages, and each language searches only itself.

The built indexes are read the way Material's search worker reads them (material/templates/
assets/javascripts/workers/search.*.js, Material 9.8): a field is split into tokens at its
HTML tags and at the index's `separator` (the build puts zero-width spaces between the words
jieba finds), lowercased and passed through the index's `pipeline`. A query's run of Han
characters is cut into the pieces the index knows (`segments`, the worker's own algorithm),
and every piece becomes a trailing-wildcard term, so a page is found when one of its tokens
starts with a piece. The worker is Material's with one loop bound changed by
docs/hooks/search_worker.py, so that the whole word is tried as a piece too.
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
    # zh.d2l.ai's words for what the site calls KV 缓存, 注意力的输出, 层归一化, 掩码: the glossary
    "键值缓存": "glossary/",
    "注意力汇聚": "glossary/",
    "层规范化": "glossary/",
    "掩蔽": "glossary/",
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
    longest known prefix at each position (up to the end of the word: docs/hooks/
    search_worker.py; Material's own loop stops one character short), then the pieces that
    overlap; the whole word when its first character starts no known term."""
    n = [0] * (len(word) + 1)
    for s in range(len(word)):
        for o in range(s + 1, len(word) + 1):
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
    vocabulary = {"热", "力图", "注意力", "自", "掩", "掩码", "键", "值"}
    assert segments("热力图", vocabulary) == {"热", "力图"}  # the word is no token: pieces
    assert segments("自注意力", vocabulary) == {"自", "注意力"}  # 注意力 ends the word: tried
    assert segments("自注意力层", vocabulary) == {"自", "注意力"}
    assert segments("指代消解", vocabulary) == {"指代消解"}  # 指 starts nothing: the word
    assert segments("掩码", vocabulary) == {"掩码"}  # a token: the word, not 掩
    assert segments("键值缓存", vocabulary) == {"键", "值"}  # 键值缓存 no token here
    assert segments("键值缓存", vocabulary | {"键值缓存"}) == {"键值缓存"}


def test_worker_patch_is_the_loop_bound_only():
    import importlib.util

    from tests.docs.pages import DOCS

    spec = importlib.util.spec_from_file_location("sw", DOCS / "hooks" / "search_worker.py")
    hook = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hook)
    worker = f"function fe(t,e){{{hook.LOOP}&&(n[s]=o-s)}}"
    patched = hook.patch(worker)
    assert patched == worker.replace("o<t.length", "o<=t.length")
    assert hook.patch(patched) == patched
    with pytest.raises(ValueError, match="expected one"):
        hook.patch("function fe(t,e){}")


def test_built_worker_tries_the_whole_word(site):
    (worker,) = (site / "assets" / "javascripts" / "workers").glob("search.*.min.js")
    text = worker.read_text(encoding="utf-8")
    assert "o<=t.length;o++)t.slice(s,o)in e" in text and "o<t.length;o++)t.slice" not in text


@pytest.mark.parametrize("word", list(WORDS))
def test_chinese_words_find_their_pages(site, word):
    """jieba (with docs/hooks/jieba_terms.txt) makes the word one token wherever a page says
    it, and the patched worker searches a token word as itself, so the search finds exactly
    the pages that say it: for zh.d2l.ai's 键值缓存, 注意力汇聚, 层规范化 and 掩蔽, the glossary
    and the changelog, and tutorial 11 for 注意力汇聚 (before the patch: 29, 43, 25 and 25
    pages, from 键* 值*, 注意力*, 层* and 掩*)."""
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
    assert found == saying, f"{word}: found {sorted(found)}, said on {sorted(saying)}"


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
