"""Every tutorial can be downloaded as a Jupyter notebook, in both languages, made from its page
by docs/hooks/notebooks.py when the site is built: the page's code as code cells, the outputs
the page shows (which tests/docs/test_pages.py checks the code prints) as their outputs, the
figures as attachments, and a link to it under the page's title."""

from __future__ import annotations

import base64
import importlib.util
import json
from pathlib import Path

import pytest

from tests.docs.pages import DOCS, LANGS, images, parse

nbformat = pytest.importorskip("nbformat", reason="jupytext/nbformat (docs extra) not installed")
pytest.importorskip("jupytext", reason="the docs extra is not installed")

_spec = importlib.util.spec_from_file_location("notebooks_hook", DOCS / "hooks" / "notebooks.py")
hook = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(hook)

TUTORIALS = sorted(p.relative_to(DOCS / "en") for p in (DOCS / "en" / "tutorials").glob("*.md"))


def _attachments(nb: dict) -> dict:
    found = {}
    for cell in nb["cells"]:
        found.update(cell.get("attachments", {}))
    return found


@pytest.mark.parametrize("lang", LANGS)
@pytest.mark.parametrize("rel", TUTORIALS, ids=str)
def test_notebook_holds_the_pages_code_outputs_and_figures(rel, lang):
    page = DOCS / lang / rel
    text = page.read_text(encoding="utf-8")
    nb = hook.notebook(text, page)
    nbformat.validate(nbformat.from_dict(nb))
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    blocks = [b for b in parse(text) if b.kind == "python"]
    assert [c["source"] for c in code] == [b.code for b in blocks]
    for cell, block in zip(code, blocks, strict=True):
        shown = [o["text"] for o in cell["outputs"]]
        assert shown == ([] if block.expected is None else [block.expected + "\n"]), block.line
    attached = _attachments(nb)
    for image in images(page):
        assert image.name in attached, f"{lang}/{rel}: {image.name} not attached"
        data = next(iter(attached[image.name].values()))
        assert base64.b64decode(data) == image.read_bytes()
    prose = "".join(c["source"] for c in nb["cells"] if c["cell_type"] == "markdown")
    assert "/// details" not in prose and "ak-play" not in prose and "](../" not in prose
    assert ".md)" not in prose and ".md#" not in prose  # links go to the site's pages


def test_hook_knows_the_published_site():
    assert f"site_url: {hook.SITE}\n" in (DOCS.parent / "mkdocs.yml").read_text()


def test_notebook_of_a_small_page(tmp_path):
    """The conversion on a page made here: output pairing, attachments, site markup dropped."""
    text = (
        "# T {#t}\n\nprose\n\n```python\nprint(1)\n```\n\n```text\n1\n```\n\nafter\n\n"
        '![a figure](fig.png)\n\n<div class="ak-play" data-play="mask"></div>\n\n'
        "/// details | Answer\n```python\nx = 2\n```\n///\n\n```text\nfree text\n```\n"
        "\nsee [masks](04-masks.md#why) and [home](../index.md)\n"
    )
    folder = tmp_path / "zh" / "tutorials"
    folder.mkdir(parents=True)
    (folder / "fig.png").write_bytes(b"\x89PNG fake")
    nb = hook.notebook(text, folder / "page.md", "https://x.io/s/")
    nbformat.validate(nbformat.from_dict(nb))
    kinds = [c["cell_type"] for c in nb["cells"]]
    assert kinds == ["markdown", "code", "markdown", "code", "markdown"]
    assert nb["cells"][0]["source"] == "# T\n\nprose"
    assert nb["cells"][1]["outputs"][0]["text"] == "1\n"
    after = nb["cells"][2]
    assert after["source"] == "after\n\n![a figure](attachment:fig.png)\n\n**Answer**"
    assert base64.b64decode(after["attachments"]["fig.png"]["image/png"]) == b"\x89PNG fake"
    assert nb["cells"][3]["outputs"] == []  # x = 2 prints nothing
    assert nb["cells"][4]["source"] == (  # not after code: prose; links to the site
        "```text\nfree text\n```\n\n"
        "see [masks](https://x.io/s/zh/tutorials/04-masks/#why) and [home](https://x.io/s/zh/)"
    )


@pytest.fixture(scope="module")
def site() -> Path:
    from tests.docs.test_site import build_site

    return build_site()


@pytest.mark.parametrize("lang", LANGS)
def test_site_links_every_tutorials_notebook_under_its_title(site, lang):
    from tests.docs.test_site import built_html

    for rel in TUTORIALS:
        html = built_html(site, rel, lang)
        name = f"{rel.stem}.ipynb"
        text = html.read_text(encoding="utf-8")
        link = text.index(f'<a href="{name}" download>')
        assert text.index("</h1>") < link < text.index("</h1>") + 600, f"{lang}/{rel}: not at top"
        shipped = json.loads((html.parent / name).read_text(encoding="utf-8"))
        page = DOCS / lang / rel
        made = hook.notebook(page.read_text(encoding="utf-8"), page, hook.SITE)
        assert shipped == made, f"{lang}/{rel}"
