"""The --out folder of every command that writes files: checked, created and locked before
any work (`prepare_out`), its previous results removed under --force (`remove_results`), and
its lock let go when the command ends (`release_out_locks`). Refusals are `UsageError`s that
name the option and the folder."""

from __future__ import annotations

import errno
import os
from collections.abc import Iterable
from pathlib import Path

from attnkit.cli._errors import UsageError
from attnkit.cli._paths import kind

__all__ = ["prepare_out", "release_out_locks", "remove_results"]


def prepare_out(
    out: Path, names: Iterable[str], *, force: bool = False, option: str = "--out"
) -> Path:
    """Check, create and lock the output folder before any work; UsageError naming `option`
    if it is a file, cannot be created or written, has a name too long, is in use by another
    run (named by its pid), or already holds one of `names` (the command's result files) and
    `force` is not set.

    The lock is an exclusive `flock` on the folder itself, held until `release_out_locks`
    (`attnkit.cli.main.main` calls it when the command ends; the kernel drops it if the
    process dies): two runs on one folder would otherwise both succeed and leave the files of
    one mixed with those of the other. Nothing is written into the folder for it. Under
    torchrun only rank 0 takes it (the ranks of one run share the folder)."""
    shown = str(out)
    if len(shown) > 80:
        shown = shown[:40] + "..." + shown[-20:]
    try:
        return _prepare(out, names, force, option, shown)
    except OSError as e:  # ENAMETOOLONG and the like, from a stat before any mkdir
        raise UsageError(f"{option} {shown!r}: {_reason(e)}") from None


def _prepare(out: Path, names: Iterable[str], force: bool, option: str, shown: str) -> Path:
    what = kind(out)
    if what not in ("a folder", "missing"):  # a file, a device, a dangling link, a loop, ...
        what = "a file" if what is None else what
        raise UsageError(f"{option} {shown!r} is {what}: give a folder to write into")
    if out.is_dir():  # a run that holds the folder is named before its files are
        _lock(out, option, shown)
    if out.is_dir() and not force:
        taken = sorted(n for n in names if (out / n).exists())
        if taken:
            raise UsageError(
                f"{option} {shown!r} already holds {', '.join(taken)}: "
                "pass --force to overwrite, or give another folder"
            )
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UsageError(f"{option} {shown!r}: {_reason(e)}") from None
    if not os.access(out, os.W_OK | os.X_OK):
        raise UsageError(f"{option} {shown!r} is not writable: give a folder you may write into")
    _lock(out, option, shown)
    return out


_LOCKS: dict[tuple[int, int], int] = {}  # (st_dev, st_ino) of a folder held -> its descriptor


def _lock(out: Path, option: str, shown: str) -> None:
    if os.environ.get("RANK", "0") != "0":
        return
    try:
        import fcntl
    except ImportError:  # not POSIX: no lock
        return
    st = out.stat()
    if (st.st_dev, st.st_ino) in _LOCKS:  # held by this process already (run() called twice)
        return
    try:
        fd = os.open(out, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:  # a folder one may write into but not read: run unlocked
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        holder = _lock_holder(st)
        who = f"pid {holder}" if holder else "its pid unknown"
        raise UsageError(
            f"{option} {shown!r} is in use by another attnkit run ({who}): wait until it ends, "
            "or give another folder"
        ) from None
    except OSError:  # a file system without flock (some network mounts): run unlocked
        os.close(fd)
        return
    _LOCKS[(st.st_dev, st.st_ino)] = fd


def _lock_holder(st: os.stat_result) -> int | None:
    """The pid holding a flock on the file of `st`, from /proc/locks (Linux), else None."""
    exact = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    try:
        with open("/proc/locks", encoding="ascii") as f:
            rows = [line.split() for line in f]
    except OSError:
        return None
    # "1: FLOCK  ADVISORY  WRITE 4242 fe:00:2155293 0 EOF" (waiters have "->" after "1:")
    held = [r for r in rows if len(r) >= 6 and r[1] == "FLOCK" and r[4].isdigit()]
    for match in (lambda f: f == exact, lambda f: f.endswith(f":{st.st_ino}")):
        pids = [int(r[4]) for r in held if match(r[5]) and int(r[4]) != os.getpid()]
        if pids:
            return pids[0]
    return None


def release_out_locks() -> None:
    """Let go of every --out folder this process holds (the command has ended)."""
    while _LOCKS:
        os.close(_LOCKS.popitem()[1])


def _reason(e: OSError) -> str:
    if e.errno == errno.ENAMETOOLONG:
        return "the name is too long for the file system: give a shorter path"
    if e.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return "permission denied: give a folder you may write into"
    if e.errno == errno.ELOOP:
        return "a part of the path is a symlink loop: give another folder"
    if e.errno in (errno.ENOTDIR, errno.EEXIST):
        return "a part of the path is a file: give a folder path"
    return f"{e.strerror or e}: give another folder"


def remove_results(out: Path, names: Iterable[str]) -> None:
    """--force: delete the previous result files named `names` from `out` (after every
    check, right before the work), so that the folder never mixes two runs."""
    for name in names:
        (out / name).unlink(missing_ok=True)
