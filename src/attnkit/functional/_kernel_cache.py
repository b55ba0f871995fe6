"""Building, caching and loading the compiled CPU attention kernel (`native.load`), trusting
no file that another user could have written.

The library is compiled once per machine and kept as ``attention_cpu-<key>.so`` (the key
hashes the sources in ``_native/``, the flags, torch's version, the compiler and this CPU's
flags) in the first
of these folders that can be created, written and trusted:

1. ``$ATTNKIT_CACHE/kernels`` (default ``~/.cache/attnkit/kernels``);
2. ``<tempdir>/attnkit-<uid>/kernels``;
3. a fresh private folder (`tempfile.TemporaryDirectory`), deleted once the library is loaded:
   a build for this process only.

Loading a shared library runs its code, and the second folder has a name anyone can predict,
so a library is loaded only from a folder no other user can write or could have created, and
only if it is the file this user built:

* folders are created with mode 0700; the kernel folder must be a directory owned by this user
  and not writable by group or others, and each folder above it owned by this user or root and,
  where others may write it, sticky (as /tmp is: they cannot rename or replace what is in it);
* the library is written under a temporary name in that folder and renamed, and so is its
  sha256, recorded in ``<library>.sha256`` (``sha256sum`` format). Before `dlopen` the library
  and the record must be regular files owned by this user, not writable by group or others, and
  the library must hash to the recorded value;
* processes building or loading in one folder take turns (`fcntl.flock` on its ``.lock``), so
  a library and its record always come from the same build.

A cached file that fails (truncated by a full disk or a killed copy — `dlopen` of such a file
crashed the process with SIGBUS —, empty, another user's, written by an attnkit that recorded
no hash) is rebuilt, with one line on stderr saying why; a folder that fails is passed over,
with one line saying why.

The ownership, mode and hash checks are in `attnkit.functional._kernel_trust`.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

import torch

from attnkit._cpu import cpu_flags
from attnkit._io import atomic_write_bytes
from attnkit.functional._kernel_prebuilt import candidates
from attnkit.functional._kernel_trust import Untrusted, hash_path, private_folder, problem

__all__ = ["load", "loaded", "origin"]

_SOURCE = Path(__file__).with_name("_native") / "attention_cpu.cpp"
_ABI = 11  # attnkit_abi_version() of the sources (7: attnkit_all_finite; 8: runs of keys;
# 9: attnkit_attention_backward_write; 10: dO's strides, Args::dout_st; 11: Args::qrows)

_lock = threading.Lock()
_lib: ctypes.CDLL | None = None
_tried = False
_looked = False  # load_if_ready has looked for a library it can load without building
_origin: str | None = None  # where the loaded library came from (see `origin`)


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _cache_dir() -> Path:
    root = os.environ.get("ATTNKIT_CACHE") or Path.home() / ".cache" / "attnkit"
    return Path(root) / "kernels"


def _fallback_dir() -> Path:
    return Path(tempfile.gettempdir()) / f"attnkit-{os.getuid()}" / "kernels"


def _compiler() -> str | None:
    for name in (os.environ.get("CXX"), "g++", "c++", "clang++"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


def _library_path(cxx: str) -> Path:
    key = hashlib.sha256()
    sources = sorted(p for p in _SOURCE.parent.iterdir() if p.suffix in (".cpp", ".h"))
    for part in (*(p.read_bytes() for p in sources), torch.__version__.encode(), cxx.encode(),
                 " ".join(_flags()).encode(), platform.machine().encode(),
                 " ".join(sorted(cpu_flags())).encode()):  # fmt: skip
        key.update(part)
    return _cache_dir() / f"attention_cpu-{key.hexdigest()[:16]}.so"


# ATTNKIT_KERNEL_ISA picks the instruction set the kernel is compiled for: "native" (the
# default: this CPU's own, -march=native) or an older level for measuring and testing that
# code path on a newer CPU ("avx2": x86-64-v3, tuned for AMD Zen 3 like the AVX2 machines CI
# runs on; "avx512": x86-64-v4, tuned generically as the wheel's prebuilt kernel is: GCC 12,
# Debian 12's, has no -mtune=znver4). The flags are part of the cache key.
_ISA_FLAGS = {
    "native": ["-march=native", "-mprefer-vector-width=512"],
    "avx512": ["-march=x86-64-v4", "-mtune=generic", "-mprefer-vector-width=512"],
    "avx2": ["-march=x86-64-v3", "-mtune=znver3"],
}


def kernel_isa() -> str:
    """The vector instruction set the kernel is built for: "avx512", "avx2" or "other" (from
    ``$ATTNKIT_KERNEL_ISA`` and this CPU's flags). ValueError for an unknown setting."""
    chosen = os.environ.get("ATTNKIT_KERNEL_ISA", "native") or "native"
    if chosen not in _ISA_FLAGS:
        raise ValueError(
            f"ATTNKIT_KERNEL_ISA must be one of {', '.join(_ISA_FLAGS)}, got {chosen!r}"
        )
    if chosen != "native":
        return chosen
    flags = cpu_flags()
    return "avx512" if "avx512f" in flags else ("avx2" if "avx2" in flags else "other")


def _flags() -> list[str]:
    torch_lib = Path(torch.__file__).resolve().parent / "lib"
    isa = os.environ.get("ATTNKIT_KERNEL_ISA", "native") or "native"
    kernel_isa()  # refuses an unknown setting
    return [
        "-O3", *_ISA_FLAGS[isa], "-fopenmp", "-fPIC", "-shared",
        "-std=c++17", f"-L{torch_lib}", "-ltorch_cpu", f"-Wl,-rpath,{torch_lib}",
        "-Wl,--no-undefined",
    ]  # fmt: skip


# --------------------------------------------------------------------------- building


def _build(cxx: str, target: Path) -> None:
    """Compile into a private temporary folder next to `target`, then write the library and
    its sha256 record, each atomically (the library first: a build killed between the two
    leaves a library its record does not match, rebuilt on the next load)."""
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        built = Path(tmp) / target.name
        cmd = [cxx, str(_SOURCE), "-o", str(built), *_flags()]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode:
            raise RuntimeError(f"{' '.join(cmd)}\n{done.stderr.strip()}")
        data = built.read_bytes()
    atomic_write_bytes(target, data, mode=0o700)
    record = f"{hashlib.sha256(data).hexdigest()}  {target.name}\n"
    atomic_write_bytes(hash_path(target), record.encode("ascii"), mode=0o600)


_FIRST_BUILD = "compiling the CPU attention kernel for this machine (one time)"


def _build_verbosely(cxx: str, path: Path, doing: str = _FIRST_BUILD, kept: bool = True) -> None:
    _say(f"attnkit: {doing} ...")
    start = time.perf_counter()
    _build(cxx, path)
    where = f", cached as {path}" if kept else " (for this process only)"
    _say(f"attnkit: kernel ready in {time.perf_counter() - start:.1f} s{where}")


@contextlib.contextmanager
def _turns(folder: Path) -> Iterator[None]:
    """Hold the folder's build lock: one process at a time checks, builds or loads there."""
    try:
        import fcntl
    except ImportError:  # no flock (Windows): the checks still hold, only rebuilds may race
        yield
        return
    flags = os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(folder / ".lock", flags, 0o600)
    except OSError:  # a read-only cache: an intact library loads, a build fails with OSError
        yield
        return
    try:
        with contextlib.suppress(OSError):  # a file system without locks: go on unlocked
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _load_or_build(cxx: str, path: Path) -> ctypes.CDLL:
    """The library at `path` in a checked folder: loaded if it passes `problem`, else built
    there (again). OSError if the folder cannot be written."""
    with _turns(path.parent):
        if not os.path.lexists(path):
            _build_verbosely(cxx, path)
            return _open_built(path)
        why = problem(path)
        if why is None:
            try:
                return _open(path)
            except OSError as err:  # its own, intact, yet refused (a changed libtorch)
                why = f"{path} cannot be loaded ({err})"
        _build_verbosely(cxx, path, f"{why}; compiling the CPU attention kernel again")
        return _open_built(path)


def _open_built(path: Path) -> ctypes.CDLL:
    try:
        return _open(path)
    except OSError as err:  # not a cache problem: no other folder would do better
        raise RuntimeError(f"{path} was just built but cannot be loaded: {err}") from err


# --------------------------------------------------------------------------- loading


def load() -> ctypes.CDLL | None:
    """The kernel library (built on first use), or None where it cannot be had."""
    global _lib, _tried
    if _tried:
        return _lib
    with _lock:
        if _tried:
            return _lib
        try:
            _lib = _load()
        except Exception as err:  # any failure leaves the PyTorch kernel in charge
            warnings.warn(
                f"attnkit: the compiled CPU attention kernel is unavailable ({err}); the chunked "
                "backend uses its PyTorch kernel (same results, slower)",
                RuntimeWarning,
                stacklevel=3,
            )
            _lib = None
        _tried = True
        return _lib


def loaded() -> ctypes.CDLL | None:
    """The kernel library if `load` has loaded it already, else None: never builds or loads."""
    return _lib


def load_if_ready() -> ctypes.CDLL | None:
    """`load` where it needs no compiler: the library if it is loaded already, or can be
    loaded from the wheel's prebuilt kernels for this CPU or from the kernel this machine
    compiled before (looked for once per process); else None, and nothing is built. For
    callers that must never wait seconds for a compiler (`attention`'s short path)."""
    global _looked
    if _tried:
        return _lib
    if _looked:
        return None
    _looked = True
    if os.environ.get("ATTNKIT_NATIVE", "1") == "0":
        return None
    ready = next(iter(candidates(_SOURCE)), None) is not None
    if not ready and (cxx := _compiler()) is not None:
        name = _library_path(cxx).name
        ready = any((folder / name).is_file() for folder in (_cache_dir(), _fallback_dir()))
    return load() if ready else None


def origin() -> str | None:
    """Where the kernel in use came from: "prebuilt avx512" / "prebuilt avx2" (shipped in the
    wheel), "compiled <path>" (built on this machine), or None (no kernel: the PyTorch path)."""
    load()
    return _origin if _lib is not None else None


def _load_prebuilt() -> ctypes.CDLL | None:
    """The best library the wheel carries for this CPU. ATTNKIT_PREBUILT=0: never; =avx2 (or
    another ISA name, also taken from ATTNKIT_KERNEL_ISA): only that one, if this CPU can run
    it."""
    global _origin
    isa = os.environ.get("ATTNKIT_KERNEL_ISA", "native") or "native"  # a chosen ISA: that one
    choice = os.environ.get("ATTNKIT_PREBUILT") or ("1" if isa == "native" else isa)
    if choice == "0":
        return None
    for isa, path in candidates(_SOURCE):
        if choice not in ("1", isa):
            continue
        try:
            lib = _open(path)
        except (OSError, RuntimeError) as err:  # an older glibc, another ABI
            _say(f"attnkit: the prebuilt {isa} kernel cannot be loaded here ({err})")
            continue
        _origin = f"prebuilt {isa}"
        return lib
    return None


def _load() -> ctypes.CDLL | None:
    global _origin
    if os.environ.get("ATTNKIT_NATIVE", "1") == "0":
        return None
    lib = _load_prebuilt()
    if lib is not None:
        return lib
    cxx = _compiler()
    if cxx is None:
        raise RuntimeError("no C++ compiler found (set CXX or install g++)")
    name = _library_path(cxx).name
    _origin = f"compiled {name}"
    for folder in (_cache_dir(), _fallback_dir()):
        try:
            return _load_or_build(cxx, private_folder(folder) / name)
        except Untrusted as err:
            _say(f"attnkit: not using {folder} for the compiled kernel: {err}")
        except OSError:  # cannot be created or written (read-only home, full disk): the next
            pass
    with tempfile.TemporaryDirectory(prefix="attnkit-") as tmp:  # mode 0700, unguessable name
        # checked too: in a temp folder others may write without the sticky bit, they could
        # rename this one away and put theirs in its place (Untrusted: no kernel, a warning)
        path = private_folder(Path(tmp)) / name
        doing = "no private cache folder: compiling the CPU attention kernel for this process"
        _build_verbosely(cxx, path, doing, kept=False)
        return _open_built(path)  # the mapping outlives the deleted file


def _open(path: Path) -> ctypes.CDLL:
    lib = ctypes.CDLL(str(path))
    if lib.attnkit_abi_version() != _ABI:
        raise RuntimeError(f"{path} has ABI {lib.attnkit_abi_version()}, expected {_ABI}")
    # The argument struct (`_native_args.Args`) is defined with the code that fills it, which
    # this module must not import: its address is passed as a void pointer (`ctypes.byref`).
    args = ctypes.c_void_p
    for name in (
        "attnkit_attention_forward",
        "attnkit_attention_backward",
        "attnkit_attention_backward_write",
    ):
        getattr(lib, name).argtypes = [args]
        getattr(lib, name).restype = None
    lib.attnkit_keep_words.argtypes = [args] + [ctypes.c_int64] * 4 + [ctypes.c_void_p]
    lib.attnkit_keep_words.restype = None
    # `_finite_scan.finite_check` binds its own prototype (no argtypes: the cheapest call)
    lib.attnkit_all_finite.argtypes = [ctypes.c_uint32] * 3 + [ctypes.c_int32]
    lib.attnkit_all_finite.restype = ctypes.c_int
    return lib
