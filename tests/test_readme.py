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


def test_readme_quotes_the_cli_timings_verbatim():
    """The CLI timing table is benchmarks/bench_cli.py's (results/cli.md, from cli.json), and
    what the README says of it holds for the recorded run: explain within 3 s and within
    0.5 s of `import torch`, --help and --version under half a second."""
    import json

    results = README.parent / "benchmarks" / "results"
    assert (results / "cli.md").read_text().strip() in README.read_text()
    median = {
        row["case"]: row["median_s"]
        for row in json.loads((results / "cli.json").read_text())["rows"]
    }
    explain = median["attnkit explain (defaults)"]
    assert explain <= 3.0 and explain - median["python -c 'import torch'"] <= 0.5
    assert median["attnkit --help"] < 0.5 and median["attnkit --version"] < 0.5
    for case, seconds in median.items():
        assert f"| {case} | {seconds:.3f} |" in README.read_text()


def test_readme_quotes_the_decode_benchmark_verbatim():
    """The cached-generation table is benchmarks/bench_decode.py's (results/decode.md, written
    with decode.json from the same rows), and both models generated the same tokens."""
    import json

    from attnkit.analysis.bench_decode import markdown_lines

    results = README.parent / "benchmarks" / "results"
    table = (results / "decode.md").read_text().strip()
    assert table in README.read_text()
    rows = json.loads((results / "decode.json").read_text())["rows"]
    assert "\n".join(markdown_lines(rows)).strip() == table
    assert all(row["same_tokens"] for row in rows)


def test_readme_quotes_the_ring_benchmark_verbatim():
    """The ring attention table is benchmarks/bench_ring.py's (results/ring.md)."""
    written = README.parent / "benchmarks" / "results" / "ring.md"
    assert written.read_text().strip() in README.read_text()


def test_readme_quotes_the_transformers_benchmark_verbatim():
    """The attnkit-vs-sdpa-vs-eager table is benchmarks/bench_hf.py's (results/hf.md)."""
    written = README.parent / "benchmarks" / "results" / "hf.md"
    assert written.read_text().strip() in README.read_text()


def test_readme_install_size_table_is_the_measured_one():
    """The install-size table is benchmarks/install_size.py's markdown of install-size.json,
    quoted verbatim in the README's install section."""
    import importlib.util
    import json

    results = README.parent / "benchmarks" / "results"
    spec = importlib.util.spec_from_file_location(
        "install_size", README.parent / "benchmarks" / "install_size.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    measured = json.loads((results / "install-size.json").read_text())
    table = module.markdown(measured)
    assert (results / "install-size.md").read_text() == table
    assert [row["extra"] for row in measured["rows"]] == list(module.EXTRAS)
    text = README.read_text()
    install = text[text.index("## Installing into your own environment") :]
    install = install[: install.index("\n## ", 1)]
    assert table.strip() in install
