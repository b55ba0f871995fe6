"""The seq2seq results table of docs/{en,zh}/results/seq2seq.md is the one
benchmarks/seq2seq_table.py wrote (benchmarks/results/seq2seq.json), and its numbers say what
the text claims."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results" / "seq2seq.json"


@pytest.fixture(scope="module")
def script():
    spec = importlib.util.spec_from_file_location(
        "seq2seq_table", ROOT / "benchmarks" / "seq2seq_table.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def result():
    return json.loads(RESULTS.read_text())


def test_readme_and_docs_quote_the_table_the_json_gives(script, result):
    table = script.markdown(result)
    assert RESULTS.with_suffix(".md").read_text() == table
    for path in script.QUOTED_IN:
        text = path.read_text()
        assert f"{script.BEGIN}\n{table}{script.END}" in text, path.name


def test_every_model_kind_has_a_row_from_the_default_command(script, result):
    assert [r["key"] for r in result["rows"]] == [key for key, _, _ in script.ROWS]
    assert not result["meta"]["quick"]
    for row, (_, _, extra) in zip(result["rows"], script.ROWS, strict=True):
        assert row["argv"] == ["attnkit", "seq2seq", "train", *extra]  # defaults otherwise
        assert set(row["by_length"]) == {str(n) for n in range(10, 21)}


def test_rnn_with_attention_reaches_95_percent_and_without_it_degrades(result):
    rows = {r["key"]: r for r in result["rows"]}
    for key in ("rnn-additive", "rnn-dot"):
        assert rows[key]["exact_match"] >= 0.95, rows[key]
    by_length = rows["rnn-none"]["by_length"]
    assert by_length["20"] < by_length["10"], by_length  # one state holds less of a longer input
