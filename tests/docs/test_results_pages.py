"""The measured tables of the site are the ones the benchmark scripts wrote, on the pages that
hold them, in both languages, and the prose says of them only what their numbers give.

A page shows a table by including the file its script wrote (`--8<-- "benchmarks/results/X.md"`,
pymdownx.snippets with check_paths, so a missing file fails the strict site build); these
tests check that each page includes it and that the file is what the script's JSON gives.
"""

from __future__ import annotations

import importlib.util
import json
import re

import pytest
import tomllib

from tests.docs.pages import DOCS, LANGS, ROOT

RESULTS = ROOT / "benchmarks" / "results"
_INCLUDE = re.compile(r'^--8<-- "([^"]+)"$', flags=re.M)

# results file -> the pages (relative to docs/<lang>/) that show it
SHOWN_ON = {
    "install-size.md": ("install.md",),
    "readme.md": ("results/benchmarks.md",),
    "cli.md": ("results/benchmarks.md",),
    "decode.md": ("results/benchmarks.md", "guides/language-models.md"),
    "hf.md": ("results/benchmarks.md", "guides/transformers.md"),
    "ring.md": ("results/benchmarks.md", "guides/ring-attention.md"),
    "threads.md": ("cli/index.md",),
    "kernel-zen4/kernel.md": ("results/benchmarks.md",),
    "kernel-zen4-avx2/kernel.md": ("results/benchmarks.md",),
    "small-calls.md": ("results/benchmarks.md",),
}


def includes(rel: str, lang: str) -> list[str]:
    return _INCLUDE.findall((DOCS / lang / rel).read_text(encoding="utf-8"))


def text(rel: str, lang: str) -> str:
    return (DOCS / lang / rel).read_text(encoding="utf-8")


def table_rows(markdown: str) -> list[list[str]]:
    """The body rows of the first markdown table in `markdown`, as lists of cells."""
    lines = [line for line in markdown.splitlines() if line.startswith("|")]
    return [[cell.strip() for cell in line.strip("|").split("|")] for line in lines[2:]]


@pytest.mark.parametrize("lang", LANGS)
@pytest.mark.parametrize("name", sorted(SHOWN_ON))
def test_each_measured_table_is_included_where_it_is_shown(name, lang):
    assert (RESULTS / name).is_file()
    for rel in SHOWN_ON[name]:
        assert f"benchmarks/results/{name}" in includes(rel, lang), f"docs/{lang}/{rel}"


def test_install_size_table_is_the_measured_one():
    spec = importlib.util.spec_from_file_location(
        "install_size", ROOT / "benchmarks" / "install_size.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    measured = json.loads((RESULTS / "install-size.json").read_text())
    assert (RESULTS / "install-size.md").read_text() == module.markdown(measured)
    assert [row["extra"] for row in measured["rows"]] == list(module.EXTRAS)


def _extra_packages(extras: dict[str, list[str]], extra: str) -> set[str]:
    """The distribution names an extra asks for, its own `attnkit[...]` references resolved."""
    names = set()
    for spec in extras[extra]:
        name = re.split(r"[<>=!~;\[ ]", spec)[0].lower().replace("_", "-")
        if name == "attnkit":
            for inner in spec[spec.index("[") + 1 : spec.index("]")].split(","):
                names |= _extra_packages(extras, inner.strip())
        else:
            names.add(name)
    return names


def test_install_size_rows_hold_every_package_of_their_extra():
    """A package added to an extra after the table was measured leaves the table stale (the
    [viz] row once left out its CJK font): each measured row installed all its extra asks."""
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    measured = json.loads((RESULTS / "install-size.json").read_text())
    for row in measured["rows"]:
        if row["extra"] == "core":
            continue
        installed = {n.replace("_", "-") for n in row["distributions"]}
        missing = _extra_packages(extras, row["extra"]) - installed
        assert not missing, (
            f"install-size.json's [{row['extra']}] row lacks {sorted(missing)}: "
            "run python benchmarks/install_size.py"
        )


def test_attention_table_backs_the_dropout_claim():
    """The claim "SDPA ... 6.6–18× slower at N = 4096" (with dropout): SDPA/auto there."""
    rows = table_rows((RESULTS / "readme.md").read_text().split("\n\n", 1)[1])
    ratios = [float(r[8].rstrip("×")) for r in rows if r[0] == "4096" and float(r[2]) > 0]
    assert len(ratios) >= 4 and all(r > 1 for r in ratios)
    claim = f"{min(ratios):.1f}–{max(ratios):.0f}×"
    for lang in LANGS:
        assert claim in text("results/benchmarks.md", lang), (lang, claim)
    assert claim in (ROOT / "README.md").read_text()


def test_cli_timings_are_the_measured_ones_and_back_the_claims():
    """cli.md is bench_cli.py's table of cli.json, and what the page says of it holds for the
    recorded run: explain within 3 s and within 0.5 s of `import torch`, --help and --version
    under half a second."""
    table = (RESULTS / "cli.md").read_text()
    median = {
        row["case"]: row["median_s"]
        for row in json.loads((RESULTS / "cli.json").read_text())["rows"]
    }
    for case, seconds in median.items():
        assert f"| {case} | {seconds:.3f} |" in table
    explain = median["attnkit explain (defaults)"]
    assert explain <= 3.0 and explain - median["python -c 'import torch'"] <= 0.5
    assert median["attnkit --help"] < 0.5 and median["attnkit --version"] < 0.5
    page = text("results/benchmarks.md", "en")
    assert "within half a second of importing torch, in\nunder 3 s" in page


def test_decode_table_is_the_measured_one_and_tokens_agree():
    """decode.md is bench_decode.py's (written with decode.json from the same rows), and both
    models generated the same tokens."""
    from attnkit.analysis.bench_decode import markdown_lines

    table = (RESULTS / "decode.md").read_text().strip()
    rows = json.loads((RESULTS / "decode.json").read_text())["rows"]
    assert "\n".join(markdown_lines(rows)).strip() == table
    assert all(row["same_tokens"] for row in rows)


def test_small_call_table_is_the_measured_one_and_backs_the_ratios():
    """small-calls.md is bench_small_calls.py's table of small-calls.json, and the ranges the
    page quotes (N <= 16, without and with gradients) are the table's."""
    from attnkit.analysis.bench_small import markdown_lines

    rows = json.loads((RESULTS / "small-calls.json").read_text())["rows"]
    table = (RESULTS / "small-calls.md").read_text()
    assert table.startswith("\n".join(markdown_lines(rows)).strip() + "\n")
    for grad in (False, True):
        ratios = [r["ratio"] for r in rows if r["grad"] == grad and r["n"] <= 16]
        claim = f"{min(ratios):.2f}–{max(ratios):.2f}"
        for lang in LANGS:
            assert claim in text("results/benchmarks.md", lang), (lang, claim)


def test_ring_memory_claims_are_the_tables():
    """The claim "0.59× (P = 2) and 0.29× (P = 4) of one process: 190 and 95 MiB ..."."""
    rows = table_rows((RESULTS / "ring.md").read_text())
    peak = {(int(r[0]), int(r[1])): float(r[3]) for r in rows}  # (P, N) -> MiB (tensors)
    units = {int(r[0]): float(r[4]) for r in rows}
    one, two, four = (peak[(p, 65536)] for p in (1, 2, 4))
    assert (units[1], units[2], units[4]) == (5.0, 5.9, 5.9)
    claim = (
        f"{two / one:.2f}× (P = 2) and {four / one:.2f}× (P = 4) of one process: "
        f"{two:.0f} and {four:.0f} MiB against {one:.0f} MiB"
    )
    page = " ".join(text("results/benchmarks.md", "en").split())
    assert claim in page
    zh = text("results/benchmarks.md", "zh")
    for number in (f"{two / one:.2f}×", f"{four / one:.2f}×", f"{two:.0f} MiB", f"{one:.0f} MiB"):
        assert number in zh, number


def test_thread_defaults_rest_on_the_measured_ratios():
    """cli/index.md's "Threads": one thread loses at most 42% where both cores are idle, and a
    second thread costs 2.9-6.6x (all commands but explain) where another process holds a core."""
    rows = json.loads((RESULTS / "threads.json").read_text())["rows"]
    idle = {r["case"]: r["ratio"] for r in rows if not r["loaded"]}
    busy = {r["case"]: r["ratio"] for r in rows if r["loaded"]}
    assert min(idle.values()) == 0.58 and "lm train" in min(idle, key=idle.get)
    others = sorted(v for k, v in idle.items() if "lm train" not in k)
    assert others[0] >= 0.78  # the other commands save at most 22%
    slowed = [v for k, v in busy.items() if not k.startswith("explain")]
    assert round(min(slowed), 1) == 2.9 and round(max(slowed), 1) == 6.6
    for lang in LANGS:
        page = text("cli/index.md", lang)
        assert "0.58" in page and "2.9" in page and "6.6" in page and "42%" in page
