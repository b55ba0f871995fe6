import json

import pytest

from attnkit.cli.main import main


@pytest.fixture(scope="module")
def vit_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("vit")
    code = main(
        ["train", "vit", "--epochs", "1", "--max-steps", "2", "--out", str(out), "--no-progress"]
    )
    assert code == 0
    return out


def test_train_writes_run_and_reports(vit_run, capsys):
    assert json.loads((vit_run / "config.json").read_text())["run"]["preset"] == "vit"
    assert (vit_run / "checkpoint.pt").is_file()
    assert main(["eval", "--checkpoint", str(vit_run)]) == 0
    assert "vit: test accuracy" in capsys.readouterr().out


def test_explain_image_writes_png(vit_run, tmp_path, capsys):
    assert (
        main(
            ["explain-image", "--checkpoint", str(vit_run), "--out", str(tmp_path), "--images", "3"]
        )
        == 0
    )
    png = tmp_path / "attention.png"
    assert png.read_bytes()[:4] == b"\x89PNG"
    assert (tmp_path / "head_distance.png").read_bytes()[:4] == b"\x89PNG"
    out = capsys.readouterr().out
    assert str(png) in out
    assert "layer 0: distance" in out and " px (mean " in out


def test_resume_continues_the_run(vit_run, capsys):
    code = main(
        [
            "train",
            "vit",
            "--epochs",
            "2",
            "--max-steps",
            "3",
            "--out",
            str(vit_run),
            "--resume",
            "--no-progress",
        ]
    )
    assert code == 0
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
            ["train", "vit", "--epochs", "0", "--out", "{tmp}/x"],
            "attnkit train: error: --epochs must be > 0, got 0",
        ),
    ],
)
def test_errors_exit_2_with_one_line(argv, message, tmp_path, capsys):
    assert main([a.format(tmp=tmp_path) for a in argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith(message) and err.count("\n") == 1 and "Traceback" not in err


def test_explain_image_refuses_cnn(tmp_path, capsys):
    out = tmp_path / "cnn"
    assert (
        main(
            [
                "train",
                "cnn",
                "--epochs",
                "1",
                "--max-steps",
                "1",
                "--out",
                str(out),
                "--no-progress",
            ]
        )
        == 0
    )
    assert main(["explain-image", "--checkpoint", str(out)]) == 2
    assert "needs a ViT or T2T-ViT run" in capsys.readouterr().err


def test_existing_run_without_resume_is_refused(vit_run, capsys):
    assert main(["train", "vit", "--out", str(vit_run), "--no-progress"]) == 2
    assert "pass resume=True (--resume)" in capsys.readouterr().err
