"""Write examples/tutorials/<NN_slug>.py, the runnable twin of each English tutorial page.

    python tests/docs/make_examples.py          # rewrite the examples
    python tests/docs/make_examples.py --check  # exit 1 if any is out of date

The twin is the page as a jupytext py:percent script: the prose becomes markdown cells and
every ```python block a code cell, so `python examples/tutorials/01_self_attention.py` runs the
tutorial and `jupytext --to ipynb` makes it a notebook.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TUTORIALS = ROOT / "docs" / "en" / "tutorials"
EXAMPLES = ROOT / "examples" / "tutorials"


def example_path(page: Path) -> Path:
    return EXAMPLES / (page.stem.replace("-", "_") + ".py")


def render(page: Path) -> str:
    import jupytext

    notebook = jupytext.reads(page.read_text(encoding="utf-8"), fmt="md")
    # No header: it would carry jupytext's version and change with every upgrade.
    notebook.metadata = {"jupytext": {"notebook_metadata_filter": "-all"}}
    source = f"docs/en/tutorials/{page.name}"
    head = f"# Made from {source} by tests/docs/make_examples.py; edit the page, not this file.\n"
    return head + jupytext.writes(notebook, fmt="py:percent")


def stale() -> list[Path]:
    """Examples that do not match their page (or have no page any more)."""
    out = []
    wanted = {example_path(p): p for p in sorted(TUTORIALS.glob("*.md"))}
    for path, page in wanted.items():
        if not path.exists() or path.read_text(encoding="utf-8") != render(page):
            out.append(path)
    if EXAMPLES.is_dir():
        out += [p for p in sorted(EXAMPLES.glob("*.py")) if p not in wanted]
    return out


def main(argv: list[str]) -> int:
    if "--check" in argv:
        bad = stale()
        for path in bad:
            print(f"out of date: {path.relative_to(ROOT)}")
        return 1 if bad else 0
    EXAMPLES.mkdir(parents=True, exist_ok=True)
    pages = sorted(TUTORIALS.glob("*.md"))
    for page in pages:
        example_path(page).write_text(render(page), encoding="utf-8")
    print(f"wrote {len(pages)} examples to {EXAMPLES.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
