"""The README is the front door: short, every link goes somewhere, its code runs.

What it used to hold besides (install sizes, benchmark tables, timings) lives on the site now
and is checked there: tests/docs/test_results_pages.py.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from tests.docs.pages import mismatches, parse, run

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
MAX_LINES = 200
SITE = "https://attnkit.github.io/attnkit/"  # mkdocs.yml's site_url
_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")  # [text](target) and ![alt](target)


def python_blocks(path: Path = README) -> list[str]:
    return re.findall(r"```python\n(.*?)```", path.read_text(), flags=re.S)


def run_python_blocks(path: Path = README) -> dict:
    """Run every ```python block of `path`, in order, in one namespace; return it."""
    namespace: dict = {}
    for i, block in enumerate(python_blocks(path)):
        try:
            exec(compile(block, f"{path.name} block {i}", "exec"), namespace)
        except Exception as err:  # pragma: no cover - the message is the point
            raise AssertionError(f"{path.name} python block {i} failed: {err!r}\n{block}") from err
    return namespace


def links(text: str) -> list[str]:
    """Local link targets of a markdown text (web addresses and #anchors left out)."""
    found = []
    for target in _LINK.findall(text):
        if "://" in target or target.startswith(("#", "mailto:")):
            continue
        found.append(target.split("#")[0])
    return found


def committed() -> set[str] | None:
    """Paths git tracks in the repository, or None outside a git checkout (an sdist)."""
    try:
        done = subprocess.run(
            ["git", "-C", str(ROOT), "ls-files"], capture_output=True, text=True, check=True
        )
    except (OSError, subprocess.CalledProcessError):
        return None
    return set(done.stdout.splitlines())


def test_readme_is_short():
    lines = README.read_text().splitlines()
    assert len(lines) <= MAX_LINES, f"README.md has {len(lines)} lines (at most {MAX_LINES})"


def test_readme_python_blocks_run_and_print_what_it_shows(tmp_path):
    assert python_blocks(), "the README shows no python example"
    results = run(README, tmp_path)
    assert any(block.expected is not None for block, _ in results), "no output shown"
    bad = mismatches(README, results)
    assert not bad, "\n\n".join(bad)


def site_pages(text: str) -> list[str]:
    """The pages of the published site (SITE) that a markdown text links, as docs/ paths:
    SITE + "zh/tutorials/04-masks/#anchor" -> "docs/zh/tutorials/04-masks.md"."""
    found = []
    for target in _LINK.findall(text):
        if not target.startswith(SITE):
            continue
        path = target[len(SITE) :].split("#")[0]
        lang = "zh" if path.startswith("zh/") else "en"
        path = path.removeprefix("zh/").rstrip("/")
        found.append(f"docs/{lang}/{path or 'index'}.md")
    return found


def test_site_url_is_the_one_mkdocs_publishes():
    assert f"site_url: {SITE}\n" in (ROOT / "mkdocs.yml").read_text()


def test_every_site_link_is_a_page_in_the_docs():
    """The README links pages of the published site (the raw docs/ files use MkDocs-only
    syntax); each one must be a page the site builds from docs/en or docs/zh."""
    pages = site_pages(README.read_text())
    assert len(pages) >= 40
    for page in pages:
        path = ROOT / page
        if not path.is_file():  # a section index: docs/en/cli/ -> docs/en/cli/index.md
            path = ROOT / page.removesuffix(".md") / "index.md"
        assert path.is_file(), f"the README links the site's {page}, which docs/ lacks"


def test_every_readme_link_is_a_committed_file():
    targets = links(README.read_text())
    assert len(targets) >= 3
    tracked = committed()
    for target in targets:
        path = (README.parent / target).resolve()
        assert path.is_file(), f"README links to {target}, which is not a file"
        if tracked is not None:
            assert path.relative_to(ROOT).as_posix() in tracked, f"{target} is not committed"


def test_readme_links_every_tutorial_and_guide_on_the_site_in_both_languages():
    targets = set(site_pages(README.read_text()))
    tutorials = sorted((ROOT / "docs" / "en" / "tutorials").glob("*.md"))
    assert len(tutorials) == 14
    for page in tutorials:
        for lang in ("en", "zh"):
            assert f"docs/{lang}/tutorials/{page.name}" in targets, f"{lang} {page.name}"
    for page in sorted((ROOT / "docs" / "en" / "guides").glob("*.md")):
        assert f"docs/en/guides/{page.name}" in targets, page.name


def test_readme_shows_the_head_view_picture():
    images = re.findall(r"!\[[^\]]*\]\(([^)\s]+\.png)\)", README.read_text())
    assert images and all(not target.startswith("/") for target in images)


def test_readme_keeps_the_two_commands():
    """.ci/run and the contributor notes rely on these two lines."""
    blocks = re.findall(r"```bash\n(.*?)```", README.read_text(), flags=re.S)
    lines = [line.split("#")[0].strip() for block in blocks for line in block.splitlines()]
    assert "python3 dev.py explain" in lines and "python3 dev.py test" in lines


def test_readme_explain_output_is_what_the_tested_page_shows():
    """The README's `attnkit explain` excerpt is a part of the run that docs/en/cli/explain.md
    shows, which tests/docs/test_pages.py checks against the real command."""
    text = README.read_text()
    excerpt = text[text.index("$ attnkit explain\n") :].split("```")[0].splitlines()[1:]
    page = parse((ROOT / "docs" / "en" / "cli" / "explain.md").read_text(encoding="utf-8"))
    shown = [exp for block in page for cmd, exp in block.commands if cmd == "attnkit explain"]
    assert len(shown) == 1
    shown_lines = shown[0].splitlines()
    for line in excerpt:
        if line.strip() != "...":
            assert line in shown_lines, f"the README shows {line!r}; cli/explain.md does not"
