"""`attnkit bench` through `main([...])` on a tiny configuration: structure only, no timings."""

import json

from attnkit.analysis.bench import KERNEL_IMPLS, MASKS, Case, auto_choice, peak_memory_mib
from attnkit.analysis.bench_small import SHAPES as SMALL_SHAPES
from attnkit.cli.main import main


def run(capsys, *argv):
    try:
        code = main(["bench", *argv])
    except SystemExit as exc:
        code = exc.code
    out = capsys.readouterr()
    return code, out.out, out.err


def test_tiny_run_writes_json_and_markdown(tmp_path, capsys):
    o = tmp_path / "o"
    json_path = o / "bench.json"
    code, out, err = run(
        capsys, "--quick", "--sizes", "16", "--dtypes", "float32", "--repeats", "1",
        "--no-memory", "--threads", "1", "--out", str(o),
    )  # fmt: skip
    assert code == 0
    assert out.strip().splitlines()[-1] == (
        f"attnkit bench: wrote {json_path}, {o / 'bench.md'} and {o / 'readme.md'} "
        "(the README's table)"
    )
    assert "[bench]" in err and "bench: 100%" in err  # progress bar on stderr
    result = json.loads(json_path.read_text())
    assert result["meta"]["threads"] == 1 and result["sgemm_gflops"]
    kernel = [r for r in result["rows"] if r["kind"] == "kernel" and r["n"] == 16]
    assert {(r["mask"], r["dropout"], r["pass"]) for r in kernel} == {
        (m, p, s) for m in MASKS for p in (0.0, 0.1) for s in ("fwd", "fwd+bwd")
    }
    for r in kernel:
        assert set(r["ms"]) == set(KERNEL_IMPLS) and all(t > 0 for t in r["ms"].values())
        assert r["auto_backend"] == ("chunked" if r["dropout"] else "fused")
    modules = {r["what"]: r for r in result["rows"] if r["kind"] == "module"}
    assert set(modules["train_step_dropout0.1"]["ms"]) == {
        "attnkit", "attnkit_compiled", "torch_need_weights", "torch_no_weights"
    }  # fmt: skip
    overhead = next(r for r in result["rows"] if r["kind"] == "overhead")["us_per_call"]
    kernel_rows = {"kernel_eager_route", "kernel_operator"}
    assert set(overhead) == {"auto", "sdpa", "chunked"} | (
        kernel_rows if result["meta"]["chunked_kernel"] == "compiled" else set()
    )
    small = [r for r in result["rows"] if r["kind"] == "small_call"]
    assert [(r["n"], r["s"], r["causal"], r["grad"]) for r in small] == [
        (*shape, grad) for grad in (False, True) for shape in SMALL_SHAPES
    ]
    assert all(r["ratio"] > 0 and set(r["us_per_call"]) == {"attnkit", "sdpa"} for r in small)
    assert "| decode step | 1 | 128 | True | True |" in (o / "bench.md").read_text()
    printed = [line for line in err.splitlines() if line.startswith("[bench] small call ")]
    assert len(printed) == len(small) and "N=1 S=128 causal, grad: attnkit " in printed[-1]
    decode = [r for r in result["rows"] if r["kind"] == "decode"]
    assert [r["batch"] for r in decode] == [1, 8] and all(r["same_tokens"] for r in decode)
    assert (
        "[bench] decode batch 8: attnkit" in err
        and "| decode (greedy, cached) |" in (o / "bench.md").read_text()
    )
    assert [t["name"] for t in result["targets"]] == list("abcdef")
    for t in result["targets"]:
        assert t["status"] in ("met", "not met", "not measured") and t["detail"]
    assert result["targets"][3]["status"] == "not measured"  # --no-memory
    md = (tmp_path / "o" / "bench.md").read_text()
    assert "| target | goal | status |" in md and "| 16 | bool | 0.1 | float32 |" in md
    assert "chunked kernel: " in md and result["meta"]["chunked_kernel"] in ("compiled", "pytorch")
    section = (o / "readme.md").read_text()  # the README's table: largest N, all masks
    assert section.count("| 16 | ") == 16 and "| f | record_attention" in section


def test_bad_threads_is_a_usage_error(tmp_path, capsys):
    code, _out, err = run(capsys, "--threads", "0", "--out", str(tmp_path))
    assert code == 2 and err.count("\n") == 1 and "--threads" in err
    assert not list(tmp_path.iterdir())


def test_peak_memory_in_a_fresh_subprocess():
    mib = peak_memory_mib("chunked", Case(64, "bool", 0.1), threads=1)
    assert mib is not None and mib >= 0


def test_auto_picks_chunked_only_for_large_masks():
    assert auto_choice(Case(1024, "bool", 0.0)) == "fused"
    assert auto_choice(Case(8192, "bool", 0.0)) == "chunked"  # 2**26-element float mask
    assert auto_choice(Case(16384, "padding", 0.0)) == "fused"  # (B, 1, 1, S) stays small
    assert auto_choice(Case(16384, "causal", 0.0)) == "fused"  # SDPA's is_causal
    assert auto_choice(Case(256, "none", 0.1)) == "chunked"
