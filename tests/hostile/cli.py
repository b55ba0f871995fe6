"""Running `attnkit` the way a hostile user does, for the tests of this folder.

`attnkit(argv)` runs the command in a subprocess (argv may hold bytes: invalid UTF-8 reaches
the program as the shell would pass it), with Ctrl-C's default action restored in the child
(a suite started in the background runs with SIGINT ignored, and the child would inherit
that) and `limit` bytes of address space if given. `in_process(argv)` calls `main` directly
(faster: torch is imported once). `one_line` checks the refusal contract: the exit code, one
line on stderr, no traceback, and the words it must hold (the argument or the file).
"""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
from pathlib import Path

from attnkit.cli.main import main

ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
SRC = str(Path(__file__).resolve().parents[2] / "src")


def _child_setup(limit: int | None):
    def setup() -> None:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        if limit is not None:
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    return setup


def command(argv, *, script: str | None = None) -> list:
    """The child's command line: ``python -m attnkit ARGV`` or ``python -c SCRIPT ARGV``."""
    head = ["-c", script] if script is not None else ["-m", "attnkit"]
    return [sys.executable, *head, *argv]


def popen(argv, *, script: str | None = None, limit: int | None = None, env=None, **kw):
    env = {**ENV, **(env or {}), "PYTHONPATH": SRC + os.pathsep + ENV.get("PYTHONPATH", "")}
    return subprocess.Popen(
        command(argv, script=script),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        preexec_fn=_child_setup(limit),
        **kw,
    )


def attnkit(argv, *, limit: int | None = None, timeout: float = 120, cwd=None, env=None):
    """(exit code, stdout, stderr) of ``python -m attnkit ARGV`` in a subprocess (`env`:
    variables to set in it)."""
    proc = popen(argv, limit=limit, cwd=cwd, env=env)
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    return proc.returncode, out.decode(errors="replace"), err.decode(errors="replace")


def in_process(argv) -> int:
    try:
        return main([str(a) for a in argv])
    except SystemExit as e:  # argparse's own errors
        return int(e.code)


def one_line(code: int, err: str, wanted: int, *words: str) -> str:
    """The single stderr line of a refusal, checked; returned for further checks."""
    lines = err.strip().splitlines()
    assert code == wanted, f"exit {code}, wanted {wanted}: {err[-2000:]}"
    assert len(lines) == 1 and "Traceback" not in err, err[-2000:]
    assert ": error: " in lines[0], lines[0]
    for word in words:
        assert word in lines[0], f"{word!r} not in {lines[0]!r}"
    return lines[0]
