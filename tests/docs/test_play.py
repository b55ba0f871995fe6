"""The interactive figures of the tutorials (docs/assets/javascripts/play.js) in headless
Chromium, served from localhost: they work offline, speak the page's language, and show
attnkit's numbers: the softmax of the divided scores, the causal weights of tutorial 01's six
tokens, and the block map and density of a mask built by clicking. Their data
(play-data.js) must be what tests/docs/make_play.py computes with attnkit now."""

# ruff: noqa: F811 (the fixtures browser, page and server come from test_browser_site)
from __future__ import annotations

import json
import math

import pytest
import torch

import attnkit
from tests.docs import make_play
from tests.docs.test_browser_site import REPO_FACTS, browser, outside, page, server  # noqa: F401

DATA = json.loads(make_play.DATA.read_text(encoding="utf-8").removeprefix(make_play.HEAD)[:-2])


def test_play_data_is_what_attnkit_computes_now():
    assert make_play.DATA.read_text(encoding="utf-8") == make_play.render(), (
        "docs/assets/javascripts/play-data.js is out of date: run python tests/docs/make_play.py"
    )


def _open(pg, path: str, kind: str):
    pg.goto(pg.server + path)
    box = pg.locator(f'.ak-play[data-play="{kind}"][data-ready="1"]')
    box.wait_for()
    return box


def _bars(box) -> list[float]:
    return [float(v) for v in box.locator(".ak-bar").evaluate_all(
        "bars => bars.map(b => b.getAttribute('data-value'))")]  # fmt: skip


@pytest.mark.browser
@pytest.mark.parametrize(
    "path", ["tutorials/01-self-attention/", "zh/tutorials/01-self-attention/"]
)
def test_softmax_figure_shows_attnkits_softmax_at_every_divisor(page, path):
    box = _open(page, path, "softmax")
    scores = torch.tensor(DATA["softmax"]["scores"], dtype=torch.float64)
    largest = []
    for divisor in (1.0, 8.0, 16.0):
        box.locator("input[type=range]").fill(str(divisor))
        shown = torch.tensor(_bars(box), dtype=torch.float64)
        q = torch.ones(1, 1, 1, 1, dtype=torch.float64)  # scores enter as keys · 1
        k = scores.reshape(1, 1, -1, 1)
        res = attnkit.attention(q, k, k, scale=1 / divisor, need_weights=True)
        torch.testing.assert_close(shown, res.weights[0, 0, 0], atol=1e-6, rtol=0)
        largest.append(shown.max().item())
    assert largest[0] > largest[1] > largest[2]  # a larger divisor flattens the row
    label = box.locator("label").first.inner_text()
    assert label.startswith("分数除以" if path.startswith("zh/") else "divide the scores by")
    assert page.errors == [] and [u for u in outside(page) if not u.startswith(REPO_FACTS)] == []


@pytest.mark.browser
def test_row_figure_shows_the_weights_of_the_picked_query(page):
    box = _open(page, "tutorials/01-self-attention/", "row")
    weights = DATA["row"]["weights"]
    for query in (0, 2, 5):
        box.locator("select").select_option(str(query))
        assert _bars(box) == pytest.approx(weights[query], abs=1e-6)
        assert sum(_bars(box)) == pytest.approx(1.0, abs=1e-5)
    assert _bars(box)[:1] and box.locator(".ak-scores").inner_text().count("−∞") == 0  # query 5
    box.locator("select").select_option("1")
    assert box.locator(".ak-scores").inner_text().count("−∞") == 4
    assert page.errors == [] and [u for u in outside(page) if not u.startswith(REPO_FACTS)] == []


@pytest.mark.browser
def test_mask_builder_gives_attnkits_block_map_and_density(page):
    """On the Chinese page: start from the prefix-LM, click three cells (one hides a pair in a
    full block, two open pairs in an empty one), and compare with attnkit's block map."""
    from attnkit import masks

    box = _open(page, "zh/tutorials/04-masks/", "mask")
    assert box.locator('button[data-preset="prefix"]').inner_text() == "前缀 6"
    box.locator('button[data-preset="prefix"]').click()
    dense = torch.tensor([[c == "1" for c in row] for row in DATA["mask"]["presets"]["prefix"]])
    for q, k in ((0, 0), (1, 14), (2, 13)):
        box.locator(f'rect[data-q="{q}"][data-k="{k}"]').click()
        dense[q, k] = ~dense[q, k]
    n, block = DATA["mask"]["n"], DATA["mask"]["block"]
    mask = masks.from_function(lambda b, h, i, j: dense[i, j], n)
    expected = mask.block_map(block, block)[0, 0].tolist()
    shown = json.loads(box.locator(".ak-blocks").get_attribute("data-blocks"))
    assert shown == expected
    assert {c for row in expected for c in row} == {0, 1, 2}  # all three kinds are on show
    density = float(box.locator(".ak-density").get_attribute("data-density"))
    assert density == pytest.approx(mask.density, abs=1e-12)
    assert math.isclose(density, dense.float().mean().item(), abs_tol=1e-7)
    assert page.errors == [] and [u for u in outside(page) if not u.startswith(REPO_FACTS)] == []
