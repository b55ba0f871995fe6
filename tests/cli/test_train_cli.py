import json

import pytest

from attnkit.cli import train
from attnkit.cli.main import main
from attnkit.train.data import DIGITS_RECIPES

TINY = ["--epochs", "1", "--max-steps", "2", "--no-progress"]


@pytest.fixture(scope="module")
def vit_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("vit")
    assert main(["train", "vit", *TINY, "--out", str(out), "--force"]) == 0
    return out


def test_recipes_spelled_in_the_parser_match_the_library():
    got = {k: (r.epochs, r.batch_size, r.lr) for k, r in DIGITS_RECIPES.items()}
    assert got == train.RECIPES


def test_train_writes_run_and_eval_reports(vit_run, tmp_path, capsys):
    assert json.loads((vit_run / "config.json").read_text())["run"]["preset"] == "vit"
    assert (vit_run / "checkpoint.pt").is_file()
    capsys.readouterr()
    assert main(["eval", "--checkpoint", str(vit_run), "--out", str(tmp_path)]) == 0
    line = capsys.readouterr().out.strip()
    assert line.startswith(f"attnkit eval: vit from {vit_run}: test accuracy ")
    assert line.endswith(f"wrote eval.json to {tmp_path}/")
    saved = json.loads((tmp_path / "eval.json").read_text())
    assert saved["model"] == "vit" and saved["test_images"] == 360
    assert 0.0 <= saved["test_acc"] <= 1.0 and saved["params"] == 101_130


def test_explain_image_writes_pngs(vit_run, tmp_path, capsys):
    argv = ["explain-image", "--checkpoint", str(vit_run), "--out", str(tmp_path)]
    assert main([*argv, "--images", "3"]) == 0
    assert (tmp_path / "attention.png").read_bytes()[:4] == b"\x89PNG"
    assert (tmp_path / "head_distance.png").read_bytes()[:4] == b"\x89PNG"
    out = capsys.readouterr().out
    assert "layer 0: distance" in out and " px (mean " in out
    last = out.strip().splitlines()[-1]
    assert last.startswith("attnkit explain-image: drew vit attention on 3 test digits")
    assert last.endswith(f"wrote attention.png, head_distance.png to {tmp_path}/")


def test_resume_continues_the_run(vit_run, capsys):
    argv = ["train", "vit", "--epochs", "2", "--max-steps", "3", "--out", str(vit_run)]
    assert main([*argv, "--resume", "--no-progress"]) == 0
    history = json.loads((vit_run / "metrics.json").read_text())["history"]
    assert [row["step"] for row in history] == [2, 3]


@pytest.mark.parametrize(
    "argv, message",
    [
        (
            ["eval", "--checkpoint", "{tmp}/nothing"],
            "attnkit eval: error: --checkpoint: no checkpoint.pt in",
        ),
        (
            ["explain-image", "--checkpoint", "{tmp}/nothing"],
            "attnkit explain-image: error: --checkpoint",
        ),
        (
            ["train", "cnn", "--resume", "--out", "{tmp}/fresh"],
            "attnkit train: error: resume: no checkpoint",
        ),
        (
            ["train", "vit", "--lr", "-1", "--out", "{tmp}/x"],
            "attnkit train: error: --lr must be a number > 0, got -1.0",
        ),
        (
            ["train", "vit", "--resume", "--force", "--out", "{tmp}/x"],
            "attnkit train: error: --resume continues the run in --out and --force replaces it",
        ),
        (
            ["explain-image", "--discard-ratio", "1", "--out", "{tmp}/x"],
            "attnkit explain-image: error: --discard-ratio must be in [0, 1), got 1.0",
        ),
    ],
)
def test_errors_exit_2_with_one_line(argv, message, tmp_path, capsys):
    assert main([a.format(tmp=tmp_path) for a in argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith(message) and err.count("\n") == 1 and "Traceback" not in err
    assert not (tmp_path / "x").exists()


def test_explain_image_refuses_cnn(tmp_path, capsys):
    out = tmp_path / "cnn"
    assert main(["train", "cnn", *TINY, "--out", str(out)]) == 0
    argv = ["explain-image", "--checkpoint", str(out), "--out", str(tmp_path / "img")]
    assert main(argv) == 2
    assert "needs a ViT or T2T-ViT run" in capsys.readouterr().err
    assert not (tmp_path / "img").exists()  # refused before --out was created


def test_existing_run_is_refused_then_replaced_with_force(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["train", "cnn", *TINY, "--out", str(out)]) == 0
    before = (out / "checkpoint.pt").stat().st_mtime_ns
    capsys.readouterr()
    assert main(["train", "cnn", *TINY, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "already holds checkpoint.pt" in err and "--force" in err
    assert (out / "checkpoint.pt").stat().st_mtime_ns == before
    assert main(["train", "cnn", *TINY, "--out", str(out), "--force", "--seed", "1"]) == 0
    config = json.loads((out / "config.json").read_text())
    assert config["run"]["init_seed"] == 1  # the new run, not a resumed old one
    history = json.loads((out / "metrics.json").read_text())["history"]
    assert [row["epoch"] for row in history] == [1]


def test_max_time_stops_inside_the_epoch_and_resume_ends_as_a_straight_run(
    tmp_path, capsys, monkeypatch
):
    """A fake clock (one second per call: the start, then once after every step) runs out
    during step 2 of --max-time 2; the run says so, exits 0, and --resume ends where a run
    that never stopped ends, weights and history alike."""
    import itertools

    import torch

    from attnkit.train import loop

    argv = ["train", "vit", "--epochs", "1", "--max-steps", "4", "--no-progress"]
    assert main([*argv, "--out", str(tmp_path / "straight"), "--quiet"]) == 0
    monkeypatch.setattr(loop, "_clock", itertools.count().__next__)
    capsys.readouterr()
    cut = tmp_path / "cut"
    assert main([*argv, "--out", str(cut), "--max-time", "2"]) == 0
    line = capsys.readouterr().out.strip()
    assert line.startswith("attnkit train: stopped by --max-time at step 2 of 4: test accuracy ")
    assert line.endswith(f"to {cut}/ (--resume continues)")
    state = torch.load(cut / "checkpoint.pt", weights_only=True)
    assert (state["step"], state["epoch_steps"], state["epoch_length"]) == (2, 2, 45)
    metrics = json.loads((cut / "metrics.json").read_text())
    assert metrics["stopped"] == "max-time" and metrics["history"] == []
    assert main([*argv, "--out", str(cut), "--resume", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["stopped"] is None and summary["steps"] == summary["total_steps"] == 4
    a, b = (
        torch.load(d / "checkpoint.pt", weights_only=True) for d in (tmp_path / "straight", cut)
    )
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
    rows = [
        json.loads((d / "metrics.json").read_text())["history"]
        for d in (tmp_path / "straight", cut)
    ]
    assert [{k: v for k, v in r.items() if k != "seconds"} for r in rows[0]] == [
        {k: v for k, v in r.items() if k != "seconds"} for r in rows[1]
    ]


def test_max_time_must_be_a_positive_number(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        main(["train", "vit", "--max-time", "0", "--out", str(tmp_path / "x")])
    assert e.value.code == 2
    assert "--max-time: must be a finite number of seconds > 0" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()
