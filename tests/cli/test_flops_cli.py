"""`attnkit flops` through `main([...])`, plus one real subprocess run."""

import json
import os
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from attnkit import masks
from attnkit.analysis import kernel_work, mha_cost, swin_window_cost, vit_cost
from attnkit.cli import flops_plot
from attnkit.cli.main import main


def run(capsys, *argv):
    """(exit code, stdout, stderr) of `attnkit flops ...`, argparse exits included."""
    try:
        code = main(["flops", *argv])
    except SystemExit as exc:
        code = exc.code
    out = capsys.readouterr()
    return code, out.out, out.err


def test_table_for_vit_b16_attention(capsys):
    code, out, err = run(capsys, "--tokens", "197", "--dim", "768", "--heads", "12")
    assert code == 0 and err == ""
    assert "4NC² + 2N²C = 4·197·768² + 2·197²·768 = 524,391,936 MACs" in out
    total = next(line for line in out.splitlines() if line.startswith("total"))
    assert total.split()[2:5] == ["524,391,936", "1,048,783,872", "100.0%"]
    assert "params: 2,362,368" in out
    rows = [line for line in out.splitlines() if line.startswith(("q_proj", "out_proj"))]
    assert len({len(r) for r in rows}) == 1  # aligned columns


@pytest.mark.parametrize(
    "argv,cost",
    [
        (["--tokens", "9", "--dim", "12", "--heads", "4"], mha_cost(9, 12, 4)),
        (
            ["--tokens", "7", "--dim", "12", "--heads", "6", "--kv-heads", "2", "--context",
             "11", "--context-dim", "5", "--out-dim", "3", "--head-dim", "4", "--causal",
             "--batch", "2"],
            mha_cost(7, 12, 6, kv_heads=2, context_len=11, context_dim=5, out_dim=3,
                     head_dim=4, causal=True, batch=2),
        ),
        (["--tokens", "9", "--dim", "12", "--heads", "4", "--no-out-proj"],
         mha_cost(9, 12, 4, out_proj=False)),
        (
            ["--tokens", "7", "--dim", "12", "--heads", "6", "--kv-heads", "3", "--context",
             "11", "--key-dim", "5", "--value-dim", "8", "--head-dim", "2", "--v-head-dim", "3",
             "--out-dim", "4", "--causal", "--batch", "2"],
            mha_cost(7, 12, 6, kv_heads=3, context_len=11, key_dim=5, value_dim=8, head_dim=2,
                     v_head_dim=3, out_dim=4, causal=True, batch=2),
        ),
        (
            ["--tokens", "5", "--dim", "8", "--heads", "2", "--context", "3", "--context-dim",
             "6", "--v-head-dim", "5", "--no-out-proj"],
            mha_cost(5, 8, 2, context_len=3, context_dim=6, v_head_dim=5, out_proj=False),
        ),
        (["--grid", "56x56", "--window", "7", "--dim", "96", "--heads", "3", "--shifted"],
         swin_window_cost(56, 56, 96, 3, 7, shifted=True)),
        (["--grid", "10x9", "--window", "7", "--dim", "8", "--heads", "2"],
         swin_window_cost(10, 9, 8, 2, 7)),
    ],
)  # fmt: skip
def test_json_equals_library(capsys, argv, cost):
    code, out, _ = run(capsys, *argv, "--json")
    assert code == 0
    data = json.loads(out)
    assert data["macs"] == cost.macs and data["flops"] == cost.flops == 2 * cost.macs
    assert data["params"] == cost.params and data["terms"] == cost.terms
    assert all(type(data[k]) is int for k in ("macs", "flops", "params", "score_matrix_bytes"))


def test_swin_names_the_memory_of_its_relative_bias(capsys):
    code, out, _ = run(capsys, "--grid", "56x56", "--window", "7", "--dim", "96", "--heads", "3")
    assert code == 0
    sf, dense = (swin_window_cost(56, 56, 96, 3, 7, dense=d) for d in (False, True))
    assert sf.memory_elements == 3 * 13**2 + 13**2 + 2 * 49 and dense.memory_elements == 4 * 49**2
    line = f"the score function holds {sf.memory_elements:,} numbers (a dense (H, M², M²) bias: "
    assert line + f"{dense.memory_elements:,})" in out
    assert "  position bias 460,992" in out  # one add per score: 64 windows · 3 heads · 49²
    code, out, _ = run(capsys, "--grid", "56x56", "--window", "7", "--dim", "96", "--heads", "3",
                       "--json")  # fmt: skip
    assert json.loads(out)["memory"] == sf.memory


def test_self_attention_without_output_projection_prints_3nc2_plus_2n2c(capsys):
    code, out, err = run(
        capsys, "--tokens", "197", "--dim", "768", "--heads", "12", "--no-out-proj"
    )
    assert code == 0 and err == ""
    assert "closed form: 3NC² + 2N²C = 3·197·768² + 2·197²·768 = 408,196,608 MACs" in out
    assert "no W_O" in out.splitlines()[0]
    assert not any(line.startswith("out_proj") for line in out.splitlines())
    assert "params: 1,771,776" in out  # 3C² + 3C


def test_general_closed_form_with_keys_and_values_apart(capsys):
    argv = ["--tokens", "9", "--dim", "64", "--heads", "4", "--context", "20", "--key-dim", "32"]
    code, out, _ = run(capsys, *argv, "--value-dim", "48", "--v-head-dim", "8")
    assert code == 0
    assert (
        "N·C·Hd_k + S·C_k·Gd_k + S·C_v·Gd_v + H·N·S·(d_k + d_v) + N·Hd_v·C_out = 9·64·64 + "
        "20·32·64 + 20·48·32 + 4·9·20·(16 + 8) + 9·32·64 = 144,256 MACs"
    ) in out
    assert (
        mha_cost(9, 64, 4, context_len=20, key_dim=32, value_dim=48, v_head_dim=8).macs == 144_256
    )


def _evaluate(numbers: str) -> int:
    """'3·197·768² + 2·197²·768' -> its integer value (digits and + · ² ( ) only)."""
    assert set(numbers) <= set("0123456789+·²() ")
    return eval(numbers.replace("·", "*").replace("²", "**2"))


@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    heads=st.sampled_from([1, 2, 3]), d=st.sampled_from([None, 2, 5]),
    dv=st.sampled_from([None, 1, 4]), ck=st.sampled_from([None, 3]),
    cv=st.sampled_from([None, 7]), s=st.sampled_from([None, 6]), out_proj=st.booleans(),
)  # fmt: skip
def test_printed_closed_form_evaluates_to_the_formula(capsys, heads, d, dv, ck, cv, s, out_proj):
    argv = ["--tokens", "5", "--dim", "6", "--heads", str(heads), "--json"]
    for flag, value in (("--head-dim", d), ("--v-head-dim", dv), ("--key-dim", ck),
                        ("--value-dim", cv), ("--context", s)):  # fmt: skip
        argv += [] if value is None else [flag, str(value)]
    argv += [] if out_proj else ["--no-out-proj"]
    code, out, err = run(capsys, *argv)
    assert code == 0, err
    data = json.loads(out)
    cost = mha_cost(5, 6, heads, head_dim=d, v_head_dim=dv, key_dim=ck, value_dim=cv,
                    context_len=s, out_proj=out_proj)  # fmt: skip
    assert data["macs"] == cost.macs and data["terms"] == cost.terms
    assert _evaluate(data["closed_form"].split(" = ")[-1]) == cost.macs
    assert ("out_proj" in data["terms"]) is out_proj


def test_model_breakdowns(capsys):
    code, out, _ = run(capsys, "--model", "vit", "--json")
    data = json.loads(out)
    assert code == 0 and data["params"] == 86_567_656 == vit_cost().total.params
    assert len([k for k in data["parts"] if k.startswith("block.")]) == 12
    code, out, _ = run(capsys, "--model", "bert")
    assert code == 0 and "layer.5" in out and "22,713,216" in out
    code, out, _ = run(capsys, "--model", "transformer", "--layers", "2", "--seq-len", "9")
    assert code == 0 and "decoder.1" in out and "generator" in out


@pytest.mark.parametrize(
    "argv,fragment",
    [
        (["--tokens", "5", "--dim", "10", "--heads", "3"], "--heads 3 must divide --dim 10"),
        (["--tokens", "5", "--dim", "12", "--heads", "4", "--kv-heads", "3"], "--kv-heads 3"),
        (["--dim", "12", "--heads", "4", "--window", "7"], "--window needs --grid"),
        (["--dim", "12", "--heads", "4", "--grid", "5by5", "--window", "2"], "HxW"),
        (["--dim", "12", "--heads", "4", "--grid", "4x4", "--tokens", "15"], "disagrees"),
        (["--tokens", "x", "--dim", "12", "--heads", "4"], "invalid int"),
        (["--tokens", "4", "--dim", "12", "--heads", "4", "--shifted"], "--shifted"),
        (["--model", "vit", "--heads", "7"], "must divide"),
        (
            ["--tokens", "5", "--dim", "12", "--heads", "4", "--no-out-proj", "--out-dim", "7"],
            "--out-dim 7 must equal H·DV = 12 with --no-out-proj",
        ),
        (
            [
                "--tokens",
                "5",
                "--dim",
                "12",
                "--heads",
                "4",
                "--context-dim",
                "5",
                "--key-dim",
                "6",
            ],
            "--context-dim 5 sets --key-dim and --value-dim; got --key-dim 6",
        ),
        (
            ["--tokens", "5", "--dim", "12", "--heads", "4", "--value-dim", "0"],
            "--value-dim must be at least 1",
        ),
        (
            ["--tokens", "5", "--dim", "12", "--heads", "4", "--v-head-dim", "-3"],
            "--v-head-dim must be at least 1",
        ),
        (["--model", "bert", "--no-out-proj"], "--model does not take --no-out-proj"),
        (
            ["--dim", "8", "--heads", "2", "--plot", "x.png", "--key-dim", "3"],
            "--plot does not take --key-dim",
        ),
        (
            ["--dim", "12", "--heads", "4", "--grid", "8x8", "--window", "4", "--no-out-proj"],
            "--window (Swin) takes only",
        ),
        *(
            (["--tokens", "9", "--dim", "8", "--heads", "2", *extra], fragment)
            for extra, fragment in [
                (["--mask", "win:3"], "argument --mask: 'win:3' is not a mask: write window:W"),
                (["--mask", "window"], "'window' is not a mask"),
                (["--mask", "window:0"], "--mask: 'window:0': the window must be at least 1"),
                (["--mask", "window:3,4"], "--mask: 'window:3,4': write window:W"),
                (["--mask", "prefix:-1"], "--mask: 'prefix:-1': write prefix:P"),
                (["--mask", "document:4,x"], "--mask: 'document:4,x': write document:L1,L2"),
                (["--mask", "document:0,9"], "every document length must be at least 1"),
                (["--mask", "document:4,4"], "--mask document:4,4 covers 8 tokens but N = 9"),
                (["--mask", "prefix:10"], "--mask prefix:10 is longer than the 9 keys"),
                (["--mask", "document:4,5", "--context", "12"], "--mask document:4,5 is for self"),
                (["--mask", "window:3", "--context", str(2**20 + 1)], "up to 1,048,576 tokens"),
            ]
        ),
        (["--model", "bert", "--mask", "window:3"], "--model does not take --mask"),
        (["--dim", "8", "--heads", "2", "--plot", "--mask", "window:3"], "leave out --mask"),
        (
            ["--dim", "8", "--heads", "2", "--grid", "8x8", "--window", "4", "--mask", "prefix:1"],
            "--window (Swin) takes only",
        ),
    ],
)
def test_bad_arguments_exit_2_with_one_line(capsys, argv, fragment):
    code, out, err = run(capsys, *argv)
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and fragment in err and "Traceback" not in err


def test_subprocess_python_m_attnkit():
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    argv = [sys.executable, "-m", "attnkit", "flops", "--tokens", "3136", "--dim", "96"]
    done = subprocess.run(
        [*argv, "--heads", "3", "--json"], capture_output=True, text=True, env=env
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["macs"] == 4 * 3136 * 96**2 + 2 * 3136**2 * 96
    bad = subprocess.run([*argv, "--heads", "5"], capture_output=True, text=True, env=env)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1


def test_plot_writes_png_atomically_into_out(capsys, tmp_path, monkeypatch):
    # the real measurement takes ~15 s: shrink it to two tiny grids here
    monkeypatch.setattr(flops_plot, "GRIDS", (4, 8))
    monkeypatch.setattr(flops_plot, "sgemm_gflops", lambda size=2048: 1.0)
    argv = ["--dim", "16", "--heads", "2", "--window", "4", "--out", str(tmp_path)]
    code, out, err = run(capsys, *argv, "--plot", "--json")
    assert code == 0, err
    target = tmp_path / "cost.png"
    assert target.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert list(tmp_path.iterdir()) == [target]  # no temporary file left behind
    data = json.loads(out)
    assert data["files"] == [str(target)] and [r["n"] for r in data["rows"]] == [16, 64]
    code, _, err = run(capsys, *argv, "--plot")  # the picture is there: refused
    assert code == 2 and "--force" in err
    code, out, _ = run(capsys, *argv, "--plot", "mine.png", "--plot-max-tokens", "16", "--quiet")
    assert code == 0 and out.count("\n") == 1
    assert out.startswith("attnkit flops: measured") and "N=16..16 tokens; wrote mine.png" in out


@pytest.mark.parametrize(
    "name,fragment",
    [("sub/cost.png", "inside --out"), ("cost.svg", ".png"), ("../x.png", "inside --out")],
)
def test_plot_name_is_a_png_file_name(capsys, tmp_path, name, fragment):
    code, out, err = run(capsys, "--plot", name, "--out", str(tmp_path / "o"))
    assert code == 2 and out == "" and fragment in err and err.count("\n") == 1
    assert not (tmp_path / "o").exists()


# --------------------------------------------------------------------------- --mask

N_MASK = 300
IDS = masks.document_ids([100, 50, 150])


@pytest.mark.parametrize(
    "argv,mask,kwargs",
    [
        (["--tokens", "300", "--mask", "window:40", "--causal"], masks.window(300, 40),
         {"causal": True}),
        (["--mask", "document:100,50,150"], masks.document(IDS), {}),
        (["--mask", "document:100,50,150", "--mask", "window:64", "--causal", "--batch", "2"],
         masks.document(IDS) & masks.window(300, 64), {"causal": True, "batch": 2}),
        (["--tokens", "300", "--mask", "prefix:70", "--no-out-proj"], masks.prefix(300, 70),
         {"out_proj": False}),
        (["--tokens", "100", "--context", "260", "--kv-heads", "2", "--mask", "window:16",
          "--mask", "prefix:20"], masks.window(100, 16, 260) & masks.prefix(100, 20, 260),
         {"context_len": 260, "kv_heads": 2}),
    ],
)  # fmt: skip
def test_mask_json_equals_the_library(capsys, argv, mask, kwargs):
    code, out, err = run(capsys, "--dim", "32", "--heads", "4", *argv, "--json")
    assert code == 0, err
    data = json.loads(out)
    cost = mha_cost(mask.n, 32, 4, mask=mask, **kwargs)
    for key in ("macs", "masked_macs", "unmasked_macs", "skipped_macs", "computed_macs"):
        assert data[key] == getattr(cost, key), key
    entries = data["score_entries"]
    causal, batch = kwargs.get("causal", False), kwargs.get("batch", 1)
    for p in ("forward", "backward"):
        work = kernel_work(mask, causal=causal, pass_=p, batch=batch, heads=4)
        assert entries["dense"] == work.dense and entries["allowed"] == work.allowed
        want = {k: getattr(work, k) for k in ("computed", "blocks", "block_q", "block_k")}
        assert entries[p] == want
    # rows that see at most ROW_PATH_KEYS keys (window 16 & prefix: 16) compute just those
    assert entries["allowed"] <= entries["forward"]["computed"] < entries["dense"]


def test_mask_table_and_closed_forms(capsys):
    argv = ["--tokens", "4096", "--dim", "512", "--heads", "8", "--mask", "window:256"]
    code, out, err = run(capsys, *argv, "--causal")
    assert code == 0 and err == ""
    assert "mask: window:256 & causal, density 0.0606" in out
    # A = N·w - w(w-1)/2 pairs per head; K: the kernel sizes its query blocks to the window,
    # 32 rows: 128 blocks spanning w + 31 keys (the first 8 fewer: 32, 64, ..., 256), of which
    # both passes take the first (rows that see at most 32 keys) as 4 tiles of 8 rows spanning
    # 8, 16, 24, 32 keys (_native/tile_path.h, tile_backward.h)
    allowed = next(line for line in out.splitlines() if line.startswith("allowed:"))
    assert "4NC² + 2·A·C = 4·4096·512² + 2·1015936·512 = 5,335,285,760 MACs" in allowed
    assert 4096 * 256 - 256 * 255 // 2 == 1015936
    computed = next(line for line in out.splitlines() if line.startswith("computed:"))
    tiles = 8 * sum(8 * i for i in range(1, 5))
    k = tiles + 32 * sum(32 * i for i in range(2, 9)) + 120 * 32 * (256 + 31)
    assert f"2·{k}·512" in computed
    for line in (allowed, computed):
        numbers = line.split(" = ")[1]
        assert f"{_evaluate(numbers):,}" == line.split(" = ")[2].split()[0]
    rows = {line.split("  ")[0]: line.split() for line in out.splitlines() if "  " in line}
    assert rows["computed, forward"][-3:] == ["1,016", "of", "32×512"]  # 8 heads' first as tiles
    assert rows["computed, backward"][-3:] == ["1,976", "of", "32×256"]  # and the backward
    assert rows["dense (B·H·N·S)"][2:4] == ["134,217,728", "100.0%"]


def test_document_lengths_give_the_tokens(capsys):
    code, out, _ = run(capsys, "--dim", "64", "--heads", "4", "--mask", "document:7,9", "--quiet")
    assert code == 0 and out.count("\n") == 1
    code, out, _ = run(capsys, "--dim", "64", "--heads", "4", "--mask", "document:7,9", "--json")
    assert json.loads(out)["macs"] == mha_cost(16, 64, 4).macs
