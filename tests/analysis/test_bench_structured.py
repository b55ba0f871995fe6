"""The structured-mask benchmark: its rows, and the memory target it reports (no timing)."""

from __future__ import annotations

import pytest

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

    code = main(["bench", "--structured", "--sizes", "64", "--out", str(tmp_path / "o")])
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].endswith("--sizes: --structured runs its own table (its sizes, float32, 1 and "
                            "2 threads); leave them out")  # fmt: skip
    assert not (tmp_path / "o").exists()
