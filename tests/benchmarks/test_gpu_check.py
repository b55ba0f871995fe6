"""benchmarks/gpu_check.py without a GPU: its arguments, budgets, test selection, junit
counting, the benchmark plan and a whole dry run on the CPU (issue 40, item 1)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch

from attnkit.analysis.bench_device import (
    MASKS,
    DeviceRow,
    device_plan,
    rows_markdown,
    run_rows,
)

ROOT = Path(__file__).resolve().parents[2]


def _script():
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "benchmarks/gpu_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


gpu_check = _script()


def test_arguments_are_checked(capsys):
    with pytest.raises(SystemExit):
        gpu_check.parse_args([])  # --out is required
    with pytest.raises(SystemExit):
        gpu_check.parse_args(["--out", "x", "--minutes", "0"])
    assert "--minutes must be > 0" in capsys.readouterr().err
    args = gpu_check.parse_args(["--out", "x"])
    assert (args.device, args.minutes, args.quick) == ("cuda", 8.0, False)


def test_budgets_keep_a_tenth_and_follow_the_skipped_stage():
    assert gpu_check.budgets(8, False, False) == pytest.approx((216.0, 216.0))
    assert gpu_check.budgets(8, True, False) == pytest.approx((0.0, 432.0))
    assert gpu_check.budgets(8, False, True) == pytest.approx((432.0, 0.0))


def test_the_cuda_test_selection_exists_and_is_what_pytest_runs(tmp_path):
    for path in gpu_check.CUDA_TESTS:
        assert (ROOT / path).is_file(), path
    cmd = gpu_check.pytest_command(tmp_path, 200)
    assert list(gpu_check.CUDA_TESTS) == cmd[3 : 3 + len(gpu_check.CUDA_TESTS)]
    assert f"--junitxml={tmp_path / 'tests.xml'}" in cmd


def test_junit_counts(tmp_path):
    xml = tmp_path / "tests.xml"
    assert gpu_check.junit_counts(xml) == {"passed": 0, "failed": 0, "errors": 0, "skipped": 0}
    xml.write_text(
        '<testsuites><testsuite name="pytest">'
        '<testcase name="a"/><testcase name="b"><failure message="x"/></testcase>'
        '<testcase name="c"><skipped message="no gpu"/></testcase>'
        '<testcase name="d"><error message="boom"/></testcase><testcase name="e"/>'
        "</testsuite></testsuites>"
    )
    assert gpu_check.junit_counts(xml) == {"passed": 2, "failed": 1, "errors": 1, "skipped": 1}


def test_the_full_plan_covers_issue_40s_table():
    rows = device_plan()
    assert {(r.b, r.h) for r in rows} == {(8, 16)}
    assert {r.n for r in rows} == {1024, 4096, 16384}
    assert {r.d for r in rows} == {64, 128}
    assert {r.dtype for r in rows} == {"float16", "bfloat16"}
    assert {r.mask for r in rows} == set(MASKS)
    assert {r.dropout for r in rows} == {0.0, 0.1}
    assert {r.backward for r in rows} == {False, True}
    assert len(rows) == len(set(rows))


def test_rows_past_the_budget_are_skipped_and_reported(monkeypatch):
    from attnkit.analysis import bench_device

    clock = iter([0.0, 0.0, 100.0])  # start, before row 1, before row 2: 100 s later
    monkeypatch.setattr(bench_device.time, "monotonic", lambda: next(clock))
    rows = [DeviceRow(1, 1, 8, 4, "float32", "causal", 0.0, False)] * 2
    results = run_rows(rows, "cpu", repeats=1, budget_s=50.0, flex=False, log=lambda _: None)
    assert results[0].ms and set(results[0].ms) == {"attnkit", "sdpa"}
    assert results[1].skipped and not results[1].ms
    table = rows_markdown(results, "t")
    assert "skipped (time budget)" in table and "×" in table


def test_dry_run_on_the_cpu_writes_its_files(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert gpu_check.main(["--out", str(tmp_path / "x")]) == 2  # no CUDA: refused, nothing run
    assert not (tmp_path / "x").exists()
    out = tmp_path / "o"
    code = gpu_check.main(["--out", str(out), "--device", "cpu", "--quick", "--skip-tests"])
    assert code == 0
    assert sorted(p.name for p in out.iterdir()) == [
        "bench.json", "bench.md", "summary.json", "summary.md",
    ]  # fmt: skip
    bench = json.loads((out / "bench.json").read_text())
    assert len(bench["rows"]) == len(device_plan(quick=True))
    assert all(r["ms"]["attnkit"] > 0 and r["ms"]["sdpa"] > 0 for r in bench["rows"])
    assert set(bench["mha_train_step_ms"]) == {"torch", "attnkit"}
    summary = json.loads((out / "summary.json").read_text())
    assert summary["environment"]["device"] == "cpu"
    assert summary["bench"]["timed"] == len(bench["rows"])
    assert f"wrote 4 files to {out}/" in capsys.readouterr().out
