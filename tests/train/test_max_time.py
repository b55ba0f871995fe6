"""`TrainConfig.max_time`: a run stops after the step during which its time ran out, with a
checkpoint there, and a resumed run ends where one that never stopped does.

The clock is fake: `loop._clock` returns the number of steps taken so far, so that "time"
runs out after a known step, whatever the machine's speed."""

import json

import pytest
import torch
from torch.utils.data import TensorDataset

from attnkit.models.vit import ViT, ViTConfig
from attnkit.train import loop
from attnkit.train.data import classify_step, evaluate_classifier, load_digits
from attnkit.train.loop import TrainConfig, fit

TINY = ViTConfig(image_size=8, dim=16, depth=1, num_heads=2, mlp_ratio=1.0, dropout=0.0)
# 64 images in batches of 16: 4 steps an epoch, 12 in all
CONFIG = TrainConfig(epochs=3, batch_size=16)


@pytest.fixture(scope="module")
def digits():
    d = load_digits()
    x, y = d.train.tensors
    return TensorDataset(x[:64], y[:64]), TensorDataset(*(t[:40] for t in d.test.tensors))


@pytest.fixture
def steps(monkeypatch):
    """The steps taken, which are also the clock's seconds."""
    taken = []
    monkeypatch.setattr(loop, "_clock", lambda: float(len(taken)))
    return taken


def _run(out, digits, steps, max_time=None, resume=False, stop_when=None):
    train, test = digits
    torch.manual_seed(0)
    model = ViT(TINY)
    noisy = classify_step(augment=lambda x: x + 0.1 * torch.randn_like(x))  # draws the RNG

    def step(m, batch):
        steps.append(1)
        return noisy(m, batch)

    result = fit(
        model,
        step,
        train,
        config=TrainConfig(**{**CONFIG.__dict__, "max_time": max_time}),
        out_dir=out,
        evaluate=lambda m: evaluate_classifier(m, test),
        resume=resume,
        run_info={"model": "tiny"},
        progress=False,
        stop_when=stop_when,
    )
    return model, result


def _state(path):
    return torch.load(path / "checkpoint.pt", weights_only=True)


def _without_seconds(history):
    return [{k: v for k, v in row.items() if k != "seconds"} for row in history]


def test_stops_inside_an_epoch_and_resume_ends_where_a_straight_run_does(tmp_path, digits, steps):
    straight, done = _run(tmp_path / "straight", digits, steps)
    assert done.stopped is None and done.total_steps == 12
    steps.clear()
    _, cut = _run(tmp_path / "cut", digits, steps, max_time=6)
    assert len(steps) == 6  # stopped after the step during which the 6th second ran out
    assert cut.stopped["step"] == 6 and cut.stopped["epoch"] == 2 and cut.total_steps == 12
    assert [row["epoch"] for row in cut.history] == [1]  # epoch 2 has no row yet
    state = _state(tmp_path / "cut")
    assert (state["epoch"], state["step"], state["epoch_steps"], state["epoch_length"]) == (
        2, 6, 2, 4,
    )  # fmt: skip
    # the schedule is the whole run's: max_time did not shorten it
    assert state["scheduler"]["_last_lr"] == _lr_after(6)
    metrics = json.loads((tmp_path / "cut" / "metrics.json").read_text())
    assert metrics["stopped"] == "max-time" and metrics["step"] == 6
    assert metrics["epoch_steps"] == 2 and 0 <= metrics["test_acc"] <= 1
    assert [row["epoch"] for row in metrics["history"]] == [1]

    resumed, result = _run(tmp_path / "cut", digits, steps, resume=True)
    assert result.stopped is None and len(steps) == 12
    for (name, a), b in zip(straight.state_dict().items(), resumed.state_dict().values(),
                            strict=True):  # fmt: skip
        assert torch.equal(a, b), name  # same batches, same random draws: bit for bit
    saved = [json.loads((tmp_path / d / "metrics.json").read_text()) for d in ("straight", "cut")]
    assert saved[1]["stopped"] is None
    assert _without_seconds(saved[0]["history"]) == _without_seconds(saved[1]["history"])


def _lr_after(step):
    model = torch.nn.Linear(1, 1)
    opt = torch.optim.AdamW(model.parameters(), lr=CONFIG.lr)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, loop._warmup_cosine(12, CONFIG.warmup))
    for _ in range(step):
        opt.step()
        sched.step()
    return sched.get_last_lr()


def test_time_out_at_an_epochs_end_keeps_its_row(tmp_path, digits, steps):
    _, result = _run(tmp_path, digits, steps, max_time=3.5)  # out during step 4, the last of 1
    assert len(steps) == 4 and result.stopped == result.history[-1]
    assert [row["step"] for row in result.history] == [4]
    state = _state(tmp_path)
    assert state["epoch_steps"] == state["epoch_length"] == 4 and "rng" not in state
    assert json.loads((tmp_path / "metrics.json").read_text())["stopped"] == "max-time"
    _, result = _run(tmp_path, digits, steps, resume=True)
    assert [row["step"] for row in result.history] == [4, 8, 12]


def test_time_out_at_the_last_step_is_no_stop(tmp_path, digits, steps):
    _, result = _run(tmp_path, digits, steps, max_time=12)
    assert len(steps) == 12 and result.stopped is None
    assert json.loads((tmp_path / "metrics.json").read_text())["stopped"] is None
    with pytest.raises(ValueError, match="already done 3 epochs"):
        _run(tmp_path, digits, steps, resume=True)


def test_a_run_that_reached_its_goal_as_time_ran_out_is_done(tmp_path, digits, steps):
    _, result = _run(tmp_path, digits, steps, max_time=3.5, stop_when=lambda r: r["epoch"] == 1)
    assert len(steps) == 4 and result.stopped is None
    assert json.loads((tmp_path / "metrics.json").read_text())["stopped"] is None


@pytest.mark.parametrize("seconds", [0.0, -1.0, float("inf"), float("nan")])
def test_max_time_must_be_a_finite_positive_number(seconds, digits, steps):
    with pytest.raises(ValueError, match="max_time must be a finite number of seconds > 0"):
        _run(None, digits, steps, max_time=seconds)
    assert steps == []
