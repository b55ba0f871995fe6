"""`attnkit seq2seq train` under torchrun: two gloo processes on CPU through `fit`."""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

TINY = ["--min-len", "3", "--max-len", "5", "--num-symbols", "5", "--batch-size", "8"]
TINY += ["--eval-size", "16", "--eval-every", "2", "--no-progress"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_torchrun_seq2seq_two_processes(tmp_path):
    out = tmp_path / "run"
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).parents[2] / "src"), OMP_NUM_THREADS="1")
    env.update(MASTER_ADDR="127.0.0.1")
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
        "--master_addr", "127.0.0.1", "--master_port", str(_free_port()),
        "-m", "attnkit", "seq2seq", "train", "--task", "reverse", "--max-steps", "3",
        "--out", str(out), "--json", *TINY,
    ]  # fmt: skip
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert len(summary) == 1 and summary[0]["step"] == 3  # rank 0 alone reports
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["world_size"] == 2 and 0.0 <= metrics["exact_match"] <= 1.0
    assert [row["step"] for row in metrics["history"]] == [2, 3]  # evaluated every 2 steps
    assert (out / "checkpoint.pt").is_file() and (out / "alignment_0.png").is_file()
