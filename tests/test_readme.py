"""Every ```python block of the README runs, in order, in one namespace."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


def test_readme_has_python_examples():
    assert len(python_blocks()) >= 4


def test_readme_python_blocks_run(capsys):
    namespace: dict = {}
    for i, block in enumerate(python_blocks()):
        try:
            exec(compile(block, f"README block {i}", "exec"), namespace)
        except Exception as err:  # pragma: no cover - the message is the point
            raise AssertionError(f"README python block {i} failed: {err!r}\n{block}") from err


def test_readme_quotes_the_benchmark_table_verbatim():
    """The performance table is the one `attnkit bench` wrote (benchmarks/results/readme.md)."""
    written = README.parent / "benchmarks" / "results" / "readme.md"
    assert written.read_text().strip() in README.read_text()
