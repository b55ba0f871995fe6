"""The structured-mask benchmark: its rows, and the memory target it reports (no timing)."""

from __future__ import annotations

import pytest

from attnkit._cpu import cpu_name
from attnkit.analysis.bench_structured import KINDS, StructuredCase, memory_row, structured_row
from attnkit.functional import native


def test_a_row_times_every_implementation_that_applies():
    row = structured_row(StructuredCase("16 documents", 256, 1), repeats=1, log=lambda m: None,
                         flex=False)  # fmt: skip
    assert set(row["ms"]) == {"structured", "structured_fb", "dense", "dense_fb", "sdpa"}
    assert all(ms > 0 for ms in row["ms"].values())
    assert row["density"] == pytest.approx(KINDS["16 documents"].describe(256).density)


@pytest.mark.skipif(not native.available(), reason="the compiled kernel could not be built here")
def test_a_window_needs_no_n_by_s_memory():
    """Window 512 at N=16384, H=2, forward + backward: the tensors alive at once stay within
    the inputs, outputs and gradients + 64 MiB (the (N, S) scores alone would be 2 GiB)."""
    got = memory_row(n=16384, window=512, heads=2)
    assert got["io_mib"] == 64
    assert got["peak_mib"] <= got["io_mib"] + 64


def test_the_cli_table_refuses_options_it_does_not_use(capsys, tmp_path):
    from attnkit.cli.main import main

    code = main(["bench", "--structured", "--repeats", "2", "--out", str(tmp_path / "o")])
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].endswith("--repeats: --structured runs its own table (float32, its "
                            "repeats); leave them out")  # fmt: skip
    code = main(["bench", "--structured", "--sizes", "1000", "--out", str(tmp_path / "o")])
    assert code == 2
    assert "--sizes 1000: the structured table needs N = (16·m)²" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("kind", list(KINDS))
def test_every_kind_of_the_zoo_runs_at_a_tiny_size(kind):
    row = structured_row(StructuredCase(kind, 256, 1), repeats=1, log=lambda m: None, flex=False)
    assert {"structured", "structured_fb", "dense", "dense_fb"} <= set(row["ms"])
    assert ("sdpa" in row["ms"]) == (kind != "soft-capping 30, causal")  # no SDPA form
    assert 0 < row["density"] <= 1


def test_the_cli_writes_the_table_at_a_tiny_size(monkeypatch, capsys, tmp_path):
    """The whole command at N=256, one thread, FlexAttention left out (its compiles take
    seconds per row): every kind gets a row, the CPU is named, the summary line says where."""
    from attnkit.analysis import bench_structured
    from attnkit.cli.main import main

    monkeypatch.setattr(bench_structured, "_flex", lambda *a: None)
    out = tmp_path / "o"
    code = main(["bench", "--structured", "--quick", "--sizes", "256", "--quiet", "--out",
                 str(out)])  # fmt: skip
    assert code == 0
    table = (out / "structured.md").read_text()
    assert all(f"| {kind} | 256 | 1 |" in table for kind in KINDS)
    assert cpu_name() in table
    assert capsys.readouterr().out.strip().endswith(f"({len(KINDS)} rows)")
