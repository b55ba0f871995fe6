"""The head view page in headless Chromium: it loads cleanly and reacts to the user."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from attnkit.viz import AttentionMaps, head_view, write_html

pytestmark = pytest.mark.browser

REPO = Path(__file__).resolve().parents[2]
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--no-first-run",
    "--disable-component-update",
    "--disable-sync",
    "--disable-quic",
]
TOKENS = ["[CLS]", "the", "cat", "sat", "on", "the", "mat", "[SEP]"]

VISIBLE_LINES = """() => Array.from(document.querySelectorAll('line.ak-line'))
  .filter(e => e.getClientRects().length > 0)
  .map(e => [Number(e.dataset.q), Number(e.dataset.k), Number(e.dataset.w)])"""


def _patterned_maps() -> AttentionMaps:
    """2 layers × 3 heads with distinct, recognisable patterns (N = S = 8)."""
    n = len(TOKENS)
    eye = torch.eye(n)
    prev = torch.roll(eye, -1, dims=1)  # query i -> key i - 1 (wrapping)
    first = torch.zeros(n, n)
    first[:, 0] = 1.0  # everyone -> [CLS]
    uniform_half = torch.full((n, n), 1.0 / n)
    nxt = torch.roll(eye, 1, dims=1)  # query i -> key i + 1
    mixed = 0.6 * eye + 0.4 * first
    mixed[0, 0] = 1.0
    layer0 = torch.stack([eye, prev, first])  # (H, N, S)
    layer1 = torch.stack([nxt, uniform_half, mixed])
    return AttentionMaps.from_layers(TOKENS, [layer0, layer1], layer_names=["enc 0", "enc 1"])


def playwright_and_chromium():
    """(playwright.sync_api, the chromium executable), or skip: the browser tests drive
    Debian's chromium through Playwright (never `playwright install`)."""
    sync_api = pytest.importorskip(
        "playwright.sync_api", reason="the playwright python package is not installed"
    )
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("no chromium executable on PATH (Debian package 'chromium')")
    return sync_api, chromium


@pytest.fixture(scope="module")
def page():
    sync_api, chromium = playwright_and_chromium()
    out = REPO / "test-artifacts"
    out.mkdir(exist_ok=True)
    html_path = write_html(out / "head_view.html", head_view(_patterned_maps(), head=0))
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=ARGS)
        pg = browser.new_page(viewport={"width": 1000, "height": 700})
        errors: list[str] = []
        pg.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        pg.on("pageerror", lambda e: errors.append(str(e)))
        requests: list[str] = []
        pg.on("request", lambda r: requests.append(r.url))
        pg.goto(html_path.as_uri())
        pg.wait_for_selector("body[data-ready='1']", timeout=10_000)
        pg.errors = errors  # type: ignore[attr-defined]
        pg.requests = requests  # type: ignore[attr-defined]
        yield pg
        browser.close()


def _lines(page) -> set[tuple[int, int]]:
    return {(q, k) for q, k, _ in page.evaluate(VISIBLE_LINES)}


def test_loads_without_errors_or_network(page):
    assert page.errors == []
    assert [u for u in page.requests if not u.startswith("file:")] == []


def test_renders_every_token_in_both_columns(page):
    assert page.locator("#ak-queries .ak-tok").count() == len(TOKENS)
    assert page.locator("#ak-keys .ak-tok").count() == len(TOKENS)
    assert page.locator("#ak-queries .ak-tok").nth(2).inner_text().startswith("cat")
    assert page.locator("#ak-layer option").count() == 2
    assert page.locator("#ak-head option").count() == 4  # 3 heads + mean


def test_selectors_change_the_lines(page):
    page.select_option("#ak-layer", "0")
    page.select_option("#ak-head", "0")
    assert _lines(page) == {(i, i) for i in range(8)}  # identity
    page.select_option("#ak-head", "2")
    assert _lines(page) == {(i, 0) for i in range(8)}  # everyone -> [CLS]
    page.select_option("#ak-layer", "1")
    page.select_option("#ak-head", "0")
    assert _lines(page) == {(i, (i + 1) % 8) for i in range(8)}
    page.select_option("#ak-head", "1")  # uniform 1/8: 64 faint lines
    weights = [w for _, _, w in page.evaluate(VISIBLE_LINES)]
    assert len(weights) == 64 and all(abs(w - 0.125) < 0.01 for w in weights)
    page.select_option("#ak-head", "3")  # mean of heads of layer 1
    assert len(_lines(page)) == 64
    assert "enc 1" in page.inner_text("#ak-status")


def test_hover_restricts_to_one_row_then_one_column(page):
    page.select_option("#ak-layer", "1")
    page.select_option("#ak-head", "2")  # mixed: 0.6 self + 0.4 [CLS]
    assert len(_lines(page)) == 15
    page.hover("#ak-queries .ak-tok >> nth=3")
    row = page.evaluate(VISIBLE_LINES)
    assert sorted((q, k) for q, k, _ in row) == [(3, 0), (3, 3)]
    assert sorted(w for *_, w in row) == pytest.approx([0.4, 0.6], abs=0.01)
    shown = page.locator("#ak-keys .ak-w").all_inner_texts()
    assert shown == ["0.40", "", "", "0.60", "", "", "", ""]  # the row's weights, by key
    page.hover("#ak-keys .ak-tok >> nth=0")
    assert _lines(page) == {(i, 0) for i in range(8)}
    page.mouse.move(5, 5)  # leave: everything again
    assert len(_lines(page)) == 15


def test_screenshot(page):
    page.select_option("#ak-layer", "1")
    page.select_option("#ak-head", "3")
    page.hover("#ak-queries .ak-tok >> nth=6")
    shot = REPO / "test-artifacts" / "head_view.png"
    page.screenshot(path=str(shot), full_page=True)
    page.mouse.move(5, 5)
    assert shot.stat().st_size > 10_000


def test_long_input_stays_responsive(page, tmp_path):
    """512 tokens, 6 layers × 12 heads: the page loads, draws at most top_k lines per
    query, and switching layer redraws (no freeze, no error)."""
    torch.manual_seed(0)
    n = 512
    maps = AttentionMaps([f"tok{i}" for i in range(n)], (torch.randn(6, 12, n, n) * 4).softmax(-1))
    html_path = write_html(tmp_path / "long.html", head_view(maps, head=5, top_k=10))
    assert html_path.stat().st_size < 2_000_000
    page.goto(html_path.as_uri())
    page.wait_for_selector("body[data-ready='1']", timeout=20_000)
    assert page.locator("#ak-queries .ak-tok").count() == n
    first = page.evaluate(VISIBLE_LINES)
    assert 0 < len(first) <= n * 10
    page.select_option("#ak-layer", "4")
    second = page.evaluate(VISIBLE_LINES)
    assert 0 < len(second) <= n * 10 and second != first
    page.hover("#ak-queries .ak-tok >> nth=100")
    assert {q for q, _, _ in page.evaluate(VISIBLE_LINES)} == {100}
    assert page.errors == []


def test_opens_on_the_given_query_in_chinese_and_keeps_a_clicked_one(page, tmp_path):
    """head_view(query=2, lang="zh"): only the row of query 2 is drawn on load (as explain's
    page opens on its focus word), a hover shows another row and leaving it comes back; a
    click pins a query, a second click lets every line show again."""
    maps = _patterned_maps()
    view = head_view(maps, layer=1, head=2, query=2, lang="zh")
    page.goto(write_html(tmp_path / "zh.html", view).as_uri())
    page.wait_for_selector("body[data-ready='1']", timeout=10_000)
    assert _lines(page) == {(2, 2), (2, 0)}  # mixed head: 0.6 self + 0.4 [CLS]
    assert "2 号头" in page.inner_text("#ak-status") and page.errors == []
    page.hover("#ak-queries .ak-tok >> nth=5")
    assert {q for q, _ in _lines(page)} == {5}
    page.mouse.move(5, 5)
    assert {q for q, _ in _lines(page)} == {2}
    page.click("#ak-queries .ak-tok >> nth=4")
    page.mouse.move(5, 5)
    assert {q for q, _ in _lines(page)} == {4}
    page.click("#ak-queries .ak-tok >> nth=4")
    page.mouse.move(5, 5)
    assert len(_lines(page)) == 15  # every query again
