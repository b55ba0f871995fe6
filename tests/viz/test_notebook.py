"""Attention inside Jupyter: the HTML fragment, the example notebook executed by a real
kernel (nbclient), and its two views loaded together in headless Chromium."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import attnkit
from attnkit.viz import AttentionMaps, AttentionRecord, HeadViewHTML, show
from tests.viz.test_browser import ARGS, playwright_and_chromium

REPO = Path(__file__).resolve().parents[2]
NOTEBOOK = REPO / "examples" / "notebooks" / "attention_in_jupyter.py"
SCREENSHOT = REPO / "docs" / "assets" / "guides" / "jupyter" / "head-view.png"
# The page that holds the notebook's outputs may load nothing from anywhere.
CSP = "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data:"
TOKENS_1 = ["[CLS]", "the", "animal", "didn", "'", "t", "cross", "the", "street", "because"]
TOKENS_1 += ["it", "was", "too", "tired", "[SEP]"]


def probs(*shape: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g) * 3).softmax(-1)


def data_of(fragment: str) -> dict:
    m = re.search(r'<script type="application/json" class="ak-data">(.*?)</script>', fragment)
    assert m is not None
    return json.loads(m.group(1))


# ---------------------------------------------------------------- the fragment, in Python


def test_fragment_is_scoped_to_its_own_id():
    maps = AttentionMaps(["a", "b", "c"], probs(2, 2, 3, 3))
    one, two = show(maps), show(maps)
    assert isinstance(one, HeadViewHTML) and one._repr_html_() == one.html
    assert re.fullmatch(r"akv-[0-9a-f]{12}", one.view_id) and one.view_id != two.view_id
    html = one.html
    assert html.startswith(f'<div id="{one.view_id}" class="ak-nb"')
    assert html.rstrip().endswith("</div>")
    assert re.findall(r'\bid="([^"]+)"', html) == [one.view_id]  # no other id inside
    assert "http://" not in html and "https://" not in html
    assert not re.search(r"""\b(src|href)\s*=""", html) and "url(" not in html
    css = re.search(r"<style>(.*?)</style>", html, re.S).group(1)
    css = re.sub(r"/\*.*?\*/", "", css, flags=re.S)
    selectors = [s.strip() for rule in re.findall(r"([^{}]+)\{", css) for s in rule.split(",")]
    assert len(selectors) > 20
    assert all(s.startswith(f"#{one.view_id}.ak-nb") for s in selectors), selectors
    # The program defines one global object and mounts on this view only.
    assert "window.attnkitViz.headView(" in html and f"getElementById('{one.view_id}')" in html


def test_payload_matches_the_arguments():
    maps = AttentionMaps(["a", "b", "c"], probs(2, 3, 3, 3), layer_names=["x", "y"])
    p = data_of(show(maps).html)
    assert (p["initialLayer"], p["initialHead"]) == (1, 3)  # last layer, mean of heads
    p = data_of(show(maps, layer=0, head=-1, top_k=2).html)
    assert (p["initialLayer"], p["initialHead"]) == (0, 2) and p["topK"] == 2
    assert p["tokens"] == ["a", "b", "c"] and p["layerNames"] == ["x", "y"]
    assert data_of(maps._repr_html_())["shape"] == [2, 3, 3, 3]


def test_title_and_tokens_cannot_break_out():
    evil = ["</script><script>alert(1)</script>", "<!--", "</div>"]
    view = show(AttentionMaps(evil, probs(1, 1, 3, 3)), title="<b>x</b>")
    assert "<script>alert" not in view.html and "<!--" not in view.html
    assert "&lt;b&gt;x&lt;/b&gt;" in view.html
    assert data_of(view.html)["tokens"] == evil


def test_large_maps_are_capped_and_say_so(monkeypatch):
    n = 300
    maps = AttentionMaps([f"t{i}" for i in range(n)], probs(4, 8, n, n))
    view = show(maps, threshold=0.0, max_bytes=100_000)  # 10 weights a row would be ~190 kB
    p = data_of(view.html)
    embedded = sum(len(p[key]) for key in ("counts", "keys", "weights"))
    assert embedded <= 100_000 and len(p["tokens"]) == 128  # max_tokens for notebooks
    assert 1 <= p["topK"] < 10
    notes = " ".join(p["notes"])
    assert f"top_k lowered from 10 to {p['topK']}" in notes
    assert "Cropped to the first 128 of 300 queries" in notes
    with pytest.raises(ValueError, match=r"max_bytes: maps of shape \(4, 8, 300, 300\)"):
        show(maps, max_bytes=1000)
    # Displaying the maps never raises: it says in one line why there is no view.
    monkeypatch.setattr("attnkit.viz.notebook.MAX_BYTES", 1000)
    assert maps._repr_html_().startswith("<p>AttentionMaps (4, 8, 300, 300): not shown inline")


def test_record_to_maps_and_repr():
    block = attnkit.EncoderBlock(16, 2, 32).eval()
    x = torch.randn(3, 5, 16)
    with attnkit.record_attention(block) as rec:
        block(x)
    maps = rec.to_maps(list("abcde"), batch_index=2)
    assert maps.shape == (1, 2, 5, 5) and maps.tokens == list("abcde")
    torch.testing.assert_close(maps.maps[0], rec["attn.fn"][2], rtol=0, atol=0)
    assert maps.layer_names == ["attn.fn"]
    assert rec.to_maps().tokens == ["0", "1", "2", "3", "4"]
    assert data_of(rec._repr_html_())["tokens"] == ["0", "1", "2", "3", "4"]
    assert data_of(show(rec, list("vwxyz")).html)["tokens"] == list("vwxyz")
    assert AttentionRecord()._repr_html_() is None  # nothing recorded: the plain repr


def test_record_with_maps_of_two_shapes():
    rec = AttentionRecord()
    rec.calls["enc"] = [probs(1, 2, 4, 4)]
    rec.calls["dec.self"] = [probs(1, 2, 3, 3)]
    rec.calls["dec.cross"] = [probs(1, 2, 3, 4)]
    html = rec._repr_html_()
    assert data_of(html)["shape"] == [1, 2, 4, 4]  # the first module's shape
    assert "Not shown (maps of another shape): dec.self, dec.cross" in html
    cross = rec.to_maps(list("xyz"), key_tokens=list("abcd"), prefix="dec.cross")
    assert cross.shape == (1, 2, 3, 4) and cross.key_tokens == list("abcd")
    assert rec.to_maps(prefix="dec.cross").key_tokens == ["0", "1", "2", "3"]
    with pytest.raises(ValueError, match=r"prefix: the maps recorded under it differ in shape"):
        rec.to_maps()
    with pytest.raises(ValueError, match=r"prefix: no attention recorded under 'x'"):
        rec.to_maps(prefix="x")
    with pytest.raises(ValueError, match=r"layers\[0\]: got \(H, N, S\) = \(2, 4, 4\)"):
        rec.to_maps(["a"], prefix="enc")
    with pytest.raises(ValueError, match="batch_index: 1 out of range"):
        rec.to_maps(prefix="enc", batch_index=1)


def test_repr_never_raises_on_bad_maps():
    rec = AttentionRecord()
    rec.calls["enc"] = [torch.full((1, 1, 2, 2), float("nan"))]
    html = rec._repr_html_()
    assert html.startswith("<p>AttentionRecord: not shown inline (maps: contains NaN")
    view = show(AttentionMaps(["a"], torch.ones(1, 1, 1, 1)))
    assert (
        repr(view)
        == f"HeadViewHTML(view_id={view.view_id!r}, {len(view.html):,} characters of HTML)"
    )


def test_repr_works_whatever_was_imported_first():
    """The renderers register from attnkit.viz/__init__.py, which Python runs before any
    attnkit.viz module: a fresh process that imports only the data classes can display."""
    code = (
        "import torch\n"
        "from attnkit.viz.maps import AttentionMaps\n"
        "m = AttentionMaps(['a', 'b'], torch.full((1, 1, 2, 2), 0.5))\n"
        "print(m._repr_html_()[:24])\n"
        "import attnkit\n"
        "with attnkit.record_attention(attnkit.EncoderBlock(8, 2, 16)) as rec:\n"
        "    pass\n"
        "print(rec._repr_html_())\n"
    )
    env = dict(os.environ, PYTHONPATH=str(REPO / "src"))
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True
    )
    first, second = out.stdout.splitlines()
    assert first.startswith('<div id="akv-') and second == "None"  # nothing recorded: None


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"layer": 1}, r"layer: expected an int in \[-1, 1\)"),
        ({"head": 2}, r"head: expected an int in \[-2, 2\)"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"top_k": 256}, "top_k"),
        ({"threshold": 1.0}, "threshold"),
        ({"max_bytes": 0}, "max_bytes: expected a positive int"),
        ({"tokens": ["a"]}, "tokens: AttentionMaps carry their own tokens"),
    ],
)
def test_bad_arguments(kwargs, match):
    maps = AttentionMaps(["a", "b"], probs(1, 2, 2, 2))
    with pytest.raises(ValueError, match=match):
        show(maps, **kwargs)


def test_bad_attn():
    with pytest.raises(ValueError, match="attn: expected AttentionMaps or AttentionRecord"):
        show(probs(1, 1, 2, 2))  # type: ignore[arg-type]


# ---------------------------------------------------------------- the notebook, executed


@pytest.fixture(scope="module")
def notebook(tmp_path_factory):
    """The example notebook (made from its py:percent file) executed by an ipykernel that
    imports attnkit from this checkout's src/, plus a first cell that reports where from."""
    import jupytext
    import nbclient
    import nbformat

    nb = jupytext.read(NOTEBOOK)
    nb.cells.insert(0, nbformat.v4.new_code_cell("import attnkit\nprint(attnkit.__file__)"))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO / "src"), env.get("PYTHONPATH")]))
    env["OMP_NUM_THREADS"] = "1"  # a shared machine: one thread is plenty for 15 tokens
    work = tmp_path_factory.mktemp("nb")
    client = nbclient.NotebookClient(
        nb, timeout=180, kernel_name="python3", resources={"metadata": {"path": str(work)}}
    )
    client.execute(env=env)
    return nb


def _outputs(nb, kind: str) -> list:
    found = []
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            if kind == "stdout" and out.get("name") == "stdout":
                found.append(out["text"])
            elif kind != "stdout" and kind in out.get("data", {}):
                found.append(out["data"][kind])
    return found


def test_notebook_runs_on_this_checkout_and_shows_two_views(notebook):
    stdout = _outputs(notebook, "stdout")
    assert Path(stdout[0].strip()) == REPO / "src" / "attnkit" / "__init__.py"
    assert "'it' -> 'animal': 0.65\n" in stdout  # layer 5, head 11 of the real MiniLM
    views = _outputs(notebook, "text/html")
    assert len(views) == 2 and all('data-attnkit="head-view"' in v for v in views)
    first, second = (data_of(v) for v in views)
    assert first["tokens"] == TOKENS_1 and len(second["tokens"]) == 16
    assert (first["initialLayer"], first["initialHead"]) == (5, 11)
    assert (second["initialLayer"], second["initialHead"]) == (5, 12)  # last layer, mean
    assert sum(len(v) for v in views) < 200_000  # small enough to keep in a notebook


# ---------------------------------------------------------------- both views in Chromium

LINES = """root => Array.from(root.querySelectorAll('line.ak-line'))
  .filter(e => e.getClientRects().length > 0)
  .map(e => [Number(e.dataset.q), Number(e.dataset.k), Number(e.dataset.w)])"""
STATE = """root => ({
  layer: root.querySelector('.ak-layer').value, head: root.querySelector('.ak-head').value,
  status: root.querySelector('.ak-status').textContent,
  shaded: Array.from(root.querySelectorAll('.ak-tok'), d => d.style.background),
  focused: root.querySelector('.ak-svg').classList.contains('ak-focused')})"""
# How Jupyter front ends insert an output: JupyterLab sets innerHTML on a new node and
# replaces each script by a fresh copy (which runs once the node is in the page); the
# classic notebook (jQuery) evaluates each script's text in a temporary <script> in <head>.
INSERT = {
    "jupyterlab": """([html, slot]) => {
        const host = document.createElement('div');
        host.innerHTML = html;
        for (const s of host.querySelectorAll('script')) {
          const c = document.createElement('script');
          for (const a of s.attributes) c.setAttribute(a.name, a.value);
          c.textContent = s.textContent;
          s.replaceWith(c);
        }
        document.getElementById(slot).appendChild(host);
      }""",
    "classic": """([html, slot]) => {
        const host = document.getElementById(slot);
        host.innerHTML = html;  // scripts inserted this way never run by themselves
        for (const s of host.querySelectorAll('script:not([type])')) {
          const e = document.createElement('script');
          e.text = s.textContent;
          document.head.appendChild(e).remove();
        }
      }""",
}


def _page(body: str) -> str:
    return (
        f'<!DOCTYPE html><html><head><meta charset="utf-8">'
        f'<meta http-equiv="Content-Security-Policy" content="{CSP}"></head>'
        f'<body><p class="ak-tok" id="outside">not a view</p>{body}</body></html>'
    )


@pytest.fixture(scope="module")
def browser():
    sync_api, chromium = playwright_and_chromium()
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=chromium, args=ARGS)
        yield b
        b.close()


def _open(browser, html_path: Path):
    pg = browser.new_page(viewport={"width": 900, "height": 800})
    errors: list[str] = []
    requests: list[str] = []
    pg.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    pg.on("pageerror", lambda e: errors.append(str(e)))
    pg.on("request", lambda r: requests.append(r.url))
    pg.goto(html_path.as_uri())
    return pg, errors, requests


def _views(pg, count: int):
    pg.wait_for_function(
        f"document.querySelectorAll('.ak-nb[data-ready=\"1\"]').length === {count}",
        timeout=15_000,
    )
    return pg.locator(".ak-nb").all()


def _count(pg, root, selector: str) -> int:
    return pg.evaluate("([r, s]) => r.querySelectorAll(s).length", [root, selector])


@pytest.mark.browser
def test_both_views_render_on_one_page_independently(notebook, browser, tmp_path):
    html_views = _outputs(notebook, "text/html")
    page = tmp_path / "notebook.html"
    page.write_text(
        _page("".join(f'<div class="output">{v}</div>' for v in html_views)), encoding="utf-8"
    )
    pg, errors, requests = _open(browser, page)
    one, two = (v.element_handle() for v in _views(pg, 2))
    assert [_count(pg, v, ".ak-queries .ak-tok") for v in (one, two)] == [15, 16]
    assert [_count(pg, v, ".ak-keys .ak-tok") for v in (one, two)] == [15, 16]
    assert pg.evaluate(STATE, one)["status"].startswith("layers.5.attn.fn, head 11:")
    assert pg.evaluate(STATE, two)["status"].startswith("layers.5.attn.fn, mean of heads:")
    assert len(pg.evaluate(LINES, one)) > 15 and len(pg.evaluate(LINES, two)) > 16

    # Hover "it" in view 1 (layer 5, head 11): its strongest line goes to "animal".
    it = TOKENS_1.index("it")
    one.query_selector_all(".ak-queries .ak-tok")[it].hover()
    row = pg.evaluate(LINES, one)
    assert {q for q, _, _ in row} == {it}
    _, k, w = max(row, key=lambda line: line[2])
    assert TOKENS_1[k] == "animal" and w == pytest.approx(0.65, abs=0.01)
    shot = REPO / "test-artifacts" / "notebook_head_view.png"
    shot.parent.mkdir(exist_ok=True)
    one.screenshot(path=str(shot))
    if os.environ.get("ATTNKIT_DOCS_UPDATE") == "1":  # the picture of docs/*/guides/jupyter.md
        SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(shot, SCREENSHOT)
    assert shot.stat().st_size > 10_000
    pg.mouse.move(1, 1)

    # Everything done in view 1 leaves view 2 exactly as it was.
    before = pg.evaluate(STATE, two), pg.evaluate(LINES, two)
    state_one = pg.evaluate(STATE, one)
    one.query_selector(".ak-layer").select_option("0")
    one.query_selector(".ak-head").select_option("3")
    one.query_selector_all(".ak-keys .ak-tok")[0].hover()
    assert pg.evaluate(STATE, one)["status"] != state_one["status"]
    assert pg.evaluate(STATE, one)["focused"]
    assert (pg.evaluate(STATE, two), pg.evaluate(LINES, two)) == before
    # ... and the other way round.
    two.query_selector(".ak-head").select_option("0")
    assert pg.evaluate(STATE, one)["status"].startswith("layers.0.attn.fn, head 3:")

    # The views' CSS reaches nothing outside them, and nothing was loaded from anywhere.
    outside = pg.evaluate("() => getComputedStyle(document.getElementById('outside')).height")
    inside = pg.evaluate("r => getComputedStyle(r.querySelector('.ak-tok')).height", one)
    assert inside == "22px" and outside != "22px"
    assert pg.evaluate("() => Object.keys(window).filter(k => k.startsWith('attnkit'))") == [
        "attnkitViz"
    ]
    assert errors == []
    assert [u for u in requests if not u.startswith("file:")] == []
    pg.close()


@pytest.mark.browser
@pytest.mark.parametrize("frontend", sorted(INSERT))
def test_views_inserted_as_jupyter_front_ends_do(notebook, browser, tmp_path, frontend):
    page = tmp_path / "empty.html"
    page.write_text(_page('<div id="slot0"></div><div id="slot1"></div>'), encoding="utf-8")
    pg, errors, _ = _open(browser, page)
    for i, view in enumerate(_outputs(notebook, "text/html")):
        pg.evaluate(INSERT[frontend], [view, f"slot{i}"])
    one, two = (v.element_handle() for v in _views(pg, 2))
    assert [_count(pg, v, ".ak-queries .ak-tok") for v in (one, two)] == [15, 16]
    before = pg.evaluate(LINES, two)
    one.query_selector(".ak-layer").select_option("1")
    assert pg.evaluate(LINES, two) == before
    assert pg.evaluate(STATE, one)["layer"] == "1" and pg.evaluate(STATE, two)["layer"] == "5"
    assert errors == []
    pg.close()
