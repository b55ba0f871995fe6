"""The built documentation site in headless Chromium, served from localhost: code fits its
column at 1440 px, formulas are typeset by the site's own KaTeX, nothing is fetched that the
site lacks, and each language's search lists only its own pages."""

from __future__ import annotations

import functools
import http.server
import threading
from urllib.parse import parse_qs, urlsplit

import pytest

from tests.docs.test_search import WORDS, load_index, page_tokens, search
from tests.docs.test_site import build_site
from tests.viz.test_browser import ARGS, playwright_and_chromium

pytestmark = pytest.mark.browser

# pages whose code blocks overflowed Material's 688 px column (5 of 20 in 01, 9 of 15 in 08,
# 9 of 19 in 10, 3 of 3 on cli/explain), and the widest console output (cli/flops, 07)
WIDE = [
    "tutorials/01-self-attention/",
    "tutorials/07-cost/",
    "tutorials/08-seeing-attention/",
    "tutorials/10-pitfalls/",
    "cli/explain/",
    "cli/flops/",
    "zh/tutorials/08-seeing-attention/",
    "zh/cli/explain-image/",
]
MATH = ["guides/ring-attention/", "zh/guides/ring-attention/"]
# Material's header asks GitHub for the repository's stars and forks (repo_url); offline it
# shows the name alone. Nothing else may leave the machine.
REPO_FACTS = "https://api.github.com/repos/attnkit/attnkit"
OVERFLOWING = """() => Array.from(document.querySelectorAll('.md-content pre')).map(pre => {
  const code = pre.querySelector('code') || pre;
  return [code.scrollWidth, code.clientWidth, pre.scrollWidth, pre.clientWidth,
          code.textContent.split('\\n')[0].slice(0, 60)];
})"""


@pytest.fixture(scope="module")
def server():
    site = build_site()
    handler = functools.partial(QuietHandler, directory=str(site))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/"
    httpd.shutdown()
    thread.join()


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def browser():
    sync_api, chromium = playwright_and_chromium()
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=ARGS)
        yield browser
        browser.close()


@pytest.fixture
def page(browser, server):
    """A 1440×900 page that records every request, failure and HTTP error; requests that
    would leave localhost are aborted (and recorded)."""
    context = browser.new_context(viewport={"width": 1440, "height": 900})
    pg = context.new_page()
    pg.requests, pg.failures, pg.errors = [], [], []
    local = urlsplit(server).netloc

    def route(r):
        if urlsplit(r.request.url).netloc == local:
            r.continue_()
        else:
            r.abort()

    pg.route("**/*", route)
    pg.on("request", lambda r: pg.requests.append(r.url))
    pg.on(
        "response", lambda r: pg.failures.append(f"{r.status} {r.url}") if r.status >= 400 else None
    )
    pg.on("pageerror", lambda e: pg.errors.append(str(e)))
    pg.server = server
    yield pg
    context.close()


def outside(pg) -> list[str]:
    return [u for u in pg.requests if not u.startswith(pg.server) and not u.startswith("data:")]


@pytest.mark.parametrize("path", WIDE)
def test_code_blocks_need_no_sideways_scrolling(page, path):
    page.goto(page.server + path)
    blocks = page.evaluate(OVERFLOWING)
    assert len(blocks) >= 2
    wide = [b for b in blocks if b[0] > b[1] or b[2] > b[3]]
    assert not wide, f"{path}: {len(wide)} of {len(blocks)} code blocks scroll: {wide}"


@pytest.mark.parametrize("path", MATH)
def test_math_is_typeset_by_the_site_itself(page, path):
    page.goto(page.server + path)
    page.wait_for_function("document.fonts.status === 'loaded'")
    formulas = page.locator(".arithmatex").count()
    assert formulas >= 5
    assert page.locator(".arithmatex .katex").count() == formulas
    assert page.locator("div.arithmatex .katex-display").count() >= 1
    assert page.locator(".katex-error").count() == 0
    assert page.evaluate("document.fonts.check('16px KaTeX_Main')")
    fonts = [u for u in page.requests if u.endswith(".woff2")]
    assert fonts and all("/assets/vendor/katex/fonts/" in u for u in fonts)
    assert [u for u in outside(page) if not u.startswith(REPO_FACTS)] == []
    assert page.errors == [] and page.failures == []


@pytest.mark.parametrize("path", ["", "tutorials/04-masks/", "zh/", "zh/tutorials/04-masks/"])
def test_pages_fetch_nothing_missing(page, path):
    """No 404s: in particular no sitemap.xml next to the page or its twin."""
    page.goto(page.server + path)
    page.wait_for_load_state("networkidle")
    assert page.failures == [] and page.errors == []
    assert not [u for u in page.requests if u.endswith("sitemap.xml")]
    assert [u for u in outside(page) if not u.startswith(REPO_FACTS)] == []


def _search(page, path: str, query: str) -> list[str]:
    """The pages Material lists for `query` (which must find fewer than 10: Material renders
    more as the list scrolls), as paths below the site root."""
    page.goto(page.server + path)
    page.fill(".md-search__input", query)
    page.wait_for_selector(".md-search-result__item")  # the worker may still be loading
    hrefs = page.eval_on_selector_all(
        ".md-search-result__item > a.md-search-result__link", "els => els.map(e => e.href)"
    )
    return sorted({urlsplit(h).path[len(urlsplit(page.server).path) :] for h in hrefs})


@pytest.mark.parametrize("word", ["指代消解", "热力图"])
def test_chinese_search_lists_the_pages_the_model_finds(page, word):
    """The real search worker agrees with tests/docs/test_search.py's model of it, and a
    Chinese page lists only Chinese pages."""
    listed = _search(page, "zh/tutorials/04-masks/", word)
    expected = search(page_tokens(load_index(build_site(), "zh")), word)
    assert listed == sorted(f"zh/{p}" for p in expected)
    assert f"zh/{WORDS[word]}" in listed


def test_english_search_lists_no_chinese_page(page):
    listed = _search(page, "tutorials/04-masks/", "mask")
    assert listed and "tutorials/04-masks/" in listed
    assert not [p for p in listed if p.startswith("zh/")]


@pytest.mark.parametrize("word", ["键值缓存", "注意力汇聚", "层规范化", "掩蔽"])
def test_zh_d2l_terms_find_the_glossary(page, word):
    """Only the pages that say the word: the glossary (the changelog, tutorial 11 for 注意力汇聚),
    not the 25 to 43 pages Material's own worker listed."""
    listed = _search(page, "zh/", word)
    expected = search(page_tokens(load_index(build_site(), "zh")), word)
    assert listed == sorted(f"zh/{p}" for p in expected)
    assert "zh/glossary/" in listed and len(listed) <= 4, listed


def test_search_links_highlight_the_whole_chinese_word(page):
    """Material's own worker searched 掩码 as 掩* and linked `?h=掩`; docs/hooks/
    search_worker.py makes the word its own term, so the page opened marks 掩码."""
    page.goto(page.server + "zh/")
    page.fill(".md-search__input", "掩码")
    page.wait_for_selector(".md-search-result__item")
    hrefs = page.eval_on_selector_all(
        ".md-search-result__item > a.md-search-result__link", "els => els.map(e => e.href)"
    )
    highlights = [parse_qs(urlsplit(h).query).get("h") for h in hrefs]
    # (a page listed only for its sections' matches links with no `h` at all)
    assert highlights.count(["掩码"]) >= 5, highlights
    assert all(h in (None, ["掩码"]) for h in highlights), highlights
    page.goto(next(h for h in hrefs if "tutorials/04-masks/" in h))
    page.wait_for_selector("mark[data-md-highlight]")
    marks = page.eval_on_selector_all(
        "mark[data-md-highlight]", "els => els.map(e => e.textContent)"
    )
    assert len(marks) >= 5 and set(marks) == {"掩码"}
