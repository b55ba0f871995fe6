"""The kernel-against-SDPA benchmark (`attnkit bench --kernel`): its rows, table and command
(tiny sizes; no assertion on time)."""

from __future__ import annotations

import json

from attnkit.analysis.bench_kernel import (
    CALLS,
    KernelCase,
    kernel_markdown,
    kernel_plan,
    kernel_row,
    machine,
    row_repeats,
)


def test_the_plan_covers_causal_and_both_head_widths_at_each_size_and_thread_count():
    plan = kernel_plan((2048, 1024), (1, 2))
    assert len(plan) == 2 * 2 * 2 * 2
    assert {(c.causal, c.d) for c in plan} == {(False, 64), (True, 64), (False, 128), (True, 128)}
    assert [c.n for c in plan[:4]] == [1024] * 4  # the fast rows first


def test_large_sizes_take_fewer_repeats_but_at_least_two():
    assert [row_repeats(n, 5) for n in (1024, 4096, 8192, 16384)] == [5, 5, 2, 2]
    assert [row_repeats(n, 12) for n in (8192, 16384)] == [6, 3]
    assert row_repeats(16384, 1) == 1  # --repeats 1 stays 1


def test_a_row_times_the_four_calls_and_gives_per_round_ratios():
    row = kernel_row(KernelCase(33, True, 16, 1, h=2), repeats=2)
    assert set(row["ms"]) == set(CALLS) and row["repeats"] == 2
    assert all(ms > 0 for ms in row["ms"].values())
    for key in ("ratio", "cpu_ratio"):
        assert set(row[key]) == {"fwd", "fwd+bwd"}
        assert all(r > 0 for r in row[key].values())


def test_the_table_names_the_cpu_and_the_kernels_instruction_set():
    row = kernel_row(KernelCase(16, False, 8, 1, h=1), repeats=1)
    about = machine()
    text = kernel_markdown([row], about)
    assert about["cpu"] in text and f"kernel built for {about['kernel_isa']}" in text
    assert text.count("\n| 16 | no | 8 | 1 |") == 1
    assert "Worst ratio: forward" in text


def test_the_command_writes_both_files_and_says_where(capsys, tmp_path):
    from attnkit.cli.main import main

    out = tmp_path / "k"
    code = main(["bench", "--kernel", "--sizes", "24", "--repeats", "1", "--threads", "1",
                 "--out", str(out), "--quiet"])  # fmt: skip
    assert code == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert str(out / "kernel.json") in last and str(out / "kernel.md") in last
    rows = json.loads((out / "kernel.json").read_text())["rows"]
    assert {(r["n"], r["threads"]) for r in rows} == {(24, 1)} and len(rows) == 4


def test_the_command_refuses_options_the_kernel_table_does_not_use(capsys, tmp_path):
    from attnkit.cli.main import main

    for extra, said in (
        (["--dtypes", "float32"], "--dtypes: --kernel times float32 attention only"),
        (["--structured"], "--structured and --kernel are two tables"),
    ):
        code = main(["bench", "--kernel", *extra, "--out", str(tmp_path / "o")])
        assert code == 2
        assert said in capsys.readouterr().err
    assert not (tmp_path / "o").exists()
