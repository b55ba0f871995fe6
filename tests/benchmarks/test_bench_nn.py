"""benchmarks/bench_nn.py (the drop-in against torch's module): it runs, and the interop guide
quotes the table it wrote verbatim, in both languages."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TABLE = ROOT / "benchmarks" / "results" / "nn.md"


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_interop_guide_quotes_the_drop_in_table_verbatim(lang):
    guide = (ROOT / "docs" / lang / "guides" / "interop.md").read_text(encoding="utf-8")
    assert TABLE.read_text(encoding="utf-8").strip() in guide


def test_tiny_run_prints_the_table():
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "bench_nn.py"), "--tiny", "--threads", "1"],
        capture_output=True, text=True, timeout=300,
        env={"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [line for line in done.stdout.splitlines() if line.startswith("| train step")]
    assert len(rows) == 4 and all(line.endswith("× |") for line in rows)
