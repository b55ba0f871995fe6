"""bench_report reads its kernel columns from the result, not from `bench` (one-way imports)."""

from __future__ import annotations

from attnkit.analysis.bench_report import markdown


def _result(meta_impls=None):
    row = {
        "kind": "kernel", "n": 16, "mask": "none", "dropout": 0.0, "dtype": "float32",
        "pass": "fwd", "auto_backend": "fused", "ms": {"auto": 1.0, "sdpa": 2.0},
    }  # fmt: skip
    meta = {"torch": "2.13.0", "threads": 1, "load_avg": 0.1}
    if meta_impls is not None:
        meta["kernel_impls"] = meta_impls
    return {"meta": meta, "sgemm_gflops": {}, "rows": [row], "targets": []}


def test_kernel_columns_follow_the_measured_implementations():
    md = markdown(_result(["auto", "reference", "sdpa"]))
    assert "| auto runs | auto | reference | sdpa | SDPA/auto |" in md
    assert "| fwd | fused | 1.0 | - | 2.0 | 2.00× |" in md  # reference was not run: "-"


def test_results_saved_before_kernel_impls_use_their_rows():
    md = markdown(_result())
    assert "| auto runs | auto | sdpa | SDPA/auto |" in md
