"""Whether the compiled-kernel cache may be trusted: a shared library is code, so it is loaded
only from a folder no other user can write or could have created, and only if it is the file
this user built (`attnkit.functional._kernel_cache` states the rules in full).

`private_folder` creates and checks a cache folder and the folders above it; `problem` says why
a cached library must not be loaded (None: it may); `hash_path` is where its sha256 record is
kept. Everything here reads `os.lstat`/`os.fstat`, never through a symlink."""

from __future__ import annotations

import contextlib
import hashlib
import os
import stat
from pathlib import Path

__all__ = ["Untrusted", "hash_path", "private_folder", "problem"]


class Untrusted(Exception):
    """A folder or file that another user could have written (the message says why)."""


def _private_group(gid: int) -> bool:
    """Whether group `gid` is this user's own (a user private group, as Fedora and RHEL make
    with umask 002): named after the user, with no other member."""
    try:
        import grp
        import pwd

        group, me = grp.getgrgid(gid), pwd.getpwuid(os.geteuid()).pw_name
    except (ImportError, KeyError):
        return False
    return group.gr_name == me and set(group.gr_mem) <= {me}


def _check_ancestor(path: Path, st: os.stat_result, uid: int) -> None:
    if st.st_uid not in (uid, 0):
        raise Untrusted(f"{path} is owned by uid {st.st_uid}, not by you (uid {uid}) or root")
    others = st.st_mode & stat.S_IWOTH or (
        st.st_mode & stat.S_IWGRP and not _private_group(st.st_gid)
    )
    if others and not st.st_mode & stat.S_ISVTX:
        raise Untrusted(f"{path} may be written by others (mode {st.st_mode & 0o7777:o})")


def _check_own(path: Path, st: os.stat_result, uid: int, kind: str) -> None:
    """A folder or file of the cache itself: owned by this user, writable by no one else."""
    if not (stat.S_ISDIR(st.st_mode) if kind == "folder" else stat.S_ISREG(st.st_mode)):
        raise Untrusted(f"{path} is not a {'directory' if kind == 'folder' else 'regular file'}")
    if st.st_uid != uid:
        raise Untrusted(f"{path} is owned by uid {st.st_uid}, not by you (uid {uid})")
    if st.st_mode & 0o022:
        raise Untrusted(
            f"{path} may be written by group or others (mode {st.st_mode & 0o7777:o}; "
            f"chmod go-w it, or remove it)"
        )


def private_folder(folder: Path) -> Path:
    """`folder` (its missing parts created with mode 0700) as a path free of symlinks, once
    checked that no other user can write or replace it. Untrusted says why not; OSError if
    it cannot be created."""
    folder = Path(os.path.abspath(folder))
    missing = [p for p in (folder, *folder.parents) if not os.path.lexists(p)]
    for part in reversed(missing):
        with contextlib.suppress(FileExistsError):
            os.mkdir(part, 0o700)
    # Checked and used from here on through the resolved path, so a symlink swapped later
    # changes nothing; the folders above it are then checked to be unreplaceable.
    real = Path(os.path.realpath(folder))
    uid = os.geteuid()
    _check_own(real, os.lstat(real), uid, "folder")
    for parent in real.parents:
        _check_ancestor(parent, os.lstat(parent), uid)
    return real


def hash_path(library: Path) -> Path:
    return library.with_name(library.name + ".sha256")


def _read_own(path: Path) -> bytes:
    """A file of the cache, after `_check_own`; never through a symlink."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    with os.fdopen(fd, "rb") as f:
        _check_own(path, os.fstat(f.fileno()), os.geteuid(), "file")
        return f.read()


def problem(library: Path) -> str | None:
    """Why the cached `library` must not be loaded, or None when it is the file this user
    built (owned, not writable by others, hashing to its record)."""
    try:
        data = _read_own(library)
    except (OSError, Untrusted) as err:  # OSError: a symlink (O_NOFOLLOW), unreadable
        return str(err)
    try:
        record = _read_own(hash_path(library)).decode("ascii", "replace").split()
    except FileNotFoundError:
        return f"{library} has no recorded sha256 (an interrupted build, or an older attnkit)"
    except (OSError, Untrusted) as err:
        return str(err)
    if not record or record[0] != hashlib.sha256(data).hexdigest():
        return f"{library} does not match its recorded sha256 (truncated or changed)"
    return None
