"""`attnkit bench` checks --sizes before it starts and stops within a second on Ctrl-C
(issue 28, item 4). `bench --sizes 65536` was accepted without a check, then ignored
Ctrl-C for minutes: a kernel call at that size runs for minutes in C++ without the GIL, and
Python handles a signal only when the main thread comes back to Python code."""

from __future__ import annotations

import signal
import time

import pytest

from attnkit.analysis.bench import Plan
from attnkit.cli._errors import UsageError
from tests.hostile.cli import attnkit, one_line, popen

QUICK = ["bench", "--quick", "--no-memory", "--dtypes", "float32", "--repeats", "1"]


def test_a_size_beyond_memory_is_refused_before_anything_runs(tmp_path):
    """65536 needs ~22 GiB (its (N, N) boolean mask and the float mask SDPA makes of it): under
    an 8 GiB address-space limit it is refused whatever the machine."""
    started = time.monotonic()
    code, _out, err = attnkit([*QUICK, "--sizes", "65536", "--out", str(tmp_path / "b")],
                              limit=8 * 2**30, timeout=60)  # fmt: skip
    line = one_line(code, err, 2, "--sizes", "N=65536", "GiB", "up to about")
    assert time.monotonic() - started < 60 and not (tmp_path / "b").exists(), line


def test_check_plan_limits():
    """Memory first, then a lower bound of the time (the kernel rows' FLOPs at matmul speed)."""
    from attnkit.analysis.bench import kernel_flops, peak_bytes
    from attnkit.cli.bench import check_plan

    plan = Plan(sizes=(256, 1024, 4096), memory_sizes=(2048,), repeats=3)  # the full default
    check_plan(plan, available=8 * 2**30, flops_per_s=20e9)  # a slow, loaded small machine
    big = Plan(sizes=(65536,), repeats=1, large_mask_size=0)
    with pytest.raises(UsageError, match=r"--sizes: N=65536 needs about 2\d\.\d GiB"):
        check_plan(big, available=16 * 2**30, flops_per_s=1e15)
    with pytest.raises(UsageError, match=r"--sizes 65536: the kernel rows would take at least"):
        check_plan(big, available=2**50, flops_per_s=100e9)
    assert peak_bytes(65536) > 5 * 65536**2 and kernel_flops(big) > 1e15


# run() as `attnkit bench` does, announcing each kernel row on stderr before it runs it
ANNOUNCE = """
import sys
import attnkit.analysis.bench as bench
real = bench.kernel_row
def announced(case, *args, **kw):
    print("KERNEL ROW", case.n, file=sys.stderr, flush=True)
    return real(case, *args, **kw)
bench.kernel_row = announced
sys.argv = ["attnkit", *sys.argv[1:]]
from attnkit.cli.main import console
console()
"""


def test_ctrl_c_stops_within_a_second_inside_a_long_kernel_call(tmp_path):
    # N=16384 on one thread: a forward call alone takes seconds on any CPU (~34 GFLOP each)
    argv = [*QUICK, "--sizes", "16384", "--threads", "1", "--out", str(tmp_path / "b")]
    proc = popen(argv, script=ANNOUNCE)
    seen = b""
    while b"KERNEL ROW" not in seen:
        line = proc.stderr.readline()
        assert line, f"bench ended before its kernel rows: {seen.decode()}"
        seen += line
    time.sleep(0.5)  # inside the row's first (long) call
    sent = time.monotonic()
    proc.send_signal(signal.SIGINT)
    try:
        _out, rest = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    took = time.monotonic() - sent
    assert proc.returncode == 130, rest.decode()
    assert rest.decode().strip().splitlines()[-1] == (
        "attnkit bench: interrupted; only complete files were written"
    )
    assert took < 2.0, f"{took:.1f} s from Ctrl-C to exit"
    assert not list((tmp_path / "b").iterdir())
