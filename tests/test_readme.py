"""Every ```python block of the README runs, in order, in one namespace."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


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


def test_readme_has_python_examples():
    assert len(python_blocks()) >= 4


def test_readme_python_blocks_run(capsys):
    run_python_blocks()


def test_readme_quotes_the_benchmark_table_verbatim():
    """The performance table is the one `attnkit bench` wrote (benchmarks/results/readme.md)."""
    written = README.parent / "benchmarks" / "results" / "readme.md"
    assert written.read_text().strip() in README.read_text()
