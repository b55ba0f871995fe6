"""Issue 28: the compiled-kernel cache loads no library another user could have planted, and
a damaged cached library is rebuilt, never loaded (a truncated one crashed the process with
SIGBUS inside ctypes.CDLL).

Every load runs in a child process, so that a crash is a failed test and not a dead pytest,
and a planted library that does get loaded shows itself: its constructor writes a marker
file. The child's compiler is a stand-in that copies a kernel built once here and logs each
build, so a test sees exactly how many builds a load made, in milliseconds.

Another user's files: as root (CI, this container) they are really given to uid 4242 with
chown; otherwise, and also as root for the second parametrisation, the child reports those
files' owner as 4242 from os.lstat/os.fstat (the checks read nothing else).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from attnkit.functional import _kernel_cache

OTHER_UID = 4242
ABI = _kernel_cache._ABI
REAL_CXX = _kernel_cache._compiler()
pytestmark = pytest.mark.skipif(REAL_CXX is None, reason="no C++ compiler: no kernel to cache")

PLANTED_SOURCE = r"""
#include <stdio.h>
#include <stdlib.h>
/* What an attacker would plant: code that runs as soon as the library is loaded (and the
   version function attnkit checks after loading, answering what attnkit expects). */
__attribute__((constructor)) static void planted(void) {
    const char* marker = getenv("ATTNKIT_TEST_MARKER");
    FILE* f = marker ? fopen(marker, "w") : NULL;
    if (f) { fputs("planted library ran\n", f); fclose(f); }
}
extern "C" long attnkit_abi_version(void) { return ABI; }
""".replace("ABI", str(ABI))

# Loads the kernel once per world (a folder set of one test case), as a new process would:
# the loader's memo is reset and the world's environment set before each load.
CHILD = r"""
import io, json, os, sys, tempfile

from attnkit.functional import _kernel_cache

foreign = set()


def owned_by_other(stat_fn):
    def wrapped(*args, **kwargs):
        st = stat_fn(*args, **kwargs)
        if (st.st_dev, st.st_ino) not in foreign:
            return st
        fields = list(st[:10])
        fields[4] = OTHER_UID
        return os.stat_result(fields)

    return wrapped


real_lstat = os.lstat
os.lstat, os.fstat, os.stat = (owned_by_other(f) for f in (os.lstat, os.fstat, os.stat))
results = []
for world in json.loads(sys.argv[1]):
    foreign = {(st.st_dev, st.st_ino) for st in map(real_lstat, world["foreign"])}
    os.environ.update(world["env"])
    tempfile.tempdir = None  # read $TMPDIR again
    _kernel_cache._tried, _kernel_cache._lib = False, None
    sys.stderr = err = io.StringIO()
    lib = _kernel_cache.load()
    sys.stderr = sys.__stderr__
    with open("/proc/self/maps") as maps:
        mapped = sorted({line.split()[-1] for line in maps if ".so" in line})
    abi = None if lib is None else lib.attnkit_abi_version()
    results.append({"abi": abi, "mapped": mapped, "err": err.getvalue().splitlines()})
print(json.dumps(results))
""".replace("OTHER_UID", str(OTHER_UID))


@pytest.fixture(scope="module")
def kernel(tmp_path_factory) -> dict[str, Path]:
    """A real kernel built once, a stand-in compiler that copies it, and a planted library."""
    root = tmp_path_factory.mktemp("kernel")
    built = root / "built" / "attention_cpu.so"
    built.parent.mkdir(mode=0o700)
    _kernel_cache._build(REAL_CXX, built)
    planted = root / "planted.so"
    source = root / "planted.cpp"
    source.write_text(PLANTED_SOURCE)
    subprocess.run([REAL_CXX, str(source), "-shared", "-fPIC", "-o", str(planted)], check=True)
    log = root / "builds.log"
    cxx = root / "fake-cxx"
    cxx.write_text(
        textwrap.dedent(f"""\
        #!/bin/sh
        # stands in for g++: copies the kernel built once to the -o path, logs the build
        out=""
        while [ $# -gt 0 ]; do [ "$1" = "-o" ] && out="$2"; shift; done
        cp "{built}" "$out" && echo "$out" >> "{log}"
        """)
    )
    cxx.chmod(0o755)
    return {"built": built, "planted": planted, "cxx": cxx, "log": log}


class World:
    """One case's folders: $ATTNKIT_CACHE, $TMPDIR, the marker a planted library would write."""

    def __init__(self, tmp_path: Path, kernel: dict[str, Path], simulate: bool = True) -> None:
        self.tmp, self.kernel, self.simulate = tmp_path, kernel, simulate
        tmp_path.mkdir(mode=0o700, exist_ok=True)
        self.cache = tmp_path / "cache" / "kernels"  # $ATTNKIT_CACHE/kernels
        self.tempdir = tmp_path / "tmp"
        self.tempdir.mkdir(mode=0o700)
        self.fallback = self.tempdir / f"attnkit-{os.getuid()}" / "kernels"
        self.name = _kernel_cache._library_path(str(kernel["cxx"])).name
        self.library = self.cache / self.name
        self.record = self.cache / f"{self.name}.sha256"
        self.marker = tmp_path / "planted-ran"
        self.foreign: list[Path] = []

    def block_cache(self) -> None:
        """$ATTNKIT_CACHE cannot be created (a file stands where the folder should be)."""
        (self.tmp / "cache").write_text("not a folder")

    def seed_cache(self) -> None:
        """The private cache as a first load leaves it (the stand-in compiler, in-process)."""
        self.cache.mkdir(parents=True, mode=0o700)
        _kernel_cache._build(str(self.kernel["cxx"]), self.library)

    def give_to_other_user(self, *paths: Path) -> None:
        if self.simulate:
            self.foreign += paths
        else:
            for path in paths:
                os.chown(path, OTHER_UID, OTHER_UID, follow_symlinks=False)

    def plant(self, folder: Path, library: Path) -> Path:
        """`library` as this world's kernel in `folder`, with a sha256 record that matches it
        (whoever plants a library can write its record too)."""
        folder.mkdir(parents=True, exist_ok=True)
        target = folder / self.name
        target.write_bytes(library.read_bytes())
        digest = hashlib.sha256(target.read_bytes()).hexdigest()
        (folder / f"{self.name}.sha256").write_text(f"{digest}  {self.name}\n")
        return target

    def config(self) -> dict:
        env = {"ATTNKIT_CACHE": str(self.tmp / "cache"), "TMPDIR": str(self.tempdir),
               "ATTNKIT_TEST_MARKER": str(self.marker)}  # fmt: skip
        return {"env": env, "foreign": [str(p) for p in self.foreign]}

    def builds(self) -> list[str]:
        """The paths the stand-in compiler wrote for this world."""
        return [p for p in self.kernel["log"].read_text().split() if p.startswith(str(self.tmp))]


def load(kernel: dict[str, Path], worlds: list[World]) -> list[dict]:
    """{"abi", "mapped", "err" (stderr lines)} of a new process's load in each world, all in
    one child process (importing torch is most of a child's time)."""
    env = {**os.environ, "CXX": str(kernel["cxx"]), "OMP_NUM_THREADS": "1"}
    env.pop("ATTNKIT_NATIVE", None)
    configs = json.dumps([w.config() for w in worlds])
    done = subprocess.run([sys.executable, "-c", CHILD, configs], env=env, capture_output=True,
                          text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, f"child died ({done.returncode}): {done.stderr}"
    return json.loads(done.stdout)


OWNERSHIP = ["chown", "simulated"] if os.geteuid() == 0 else ["simulated"]


def assert_planted_never_ran(world: World, result: dict) -> None:
    assert not world.marker.exists(), "the planted library was loaded"
    assert result["abi"] == ABI, result  # the kernel still runs, from a library this user built
    assert not any(path.startswith(str(world.fallback)) for path in result["mapped"])


def test_library_planted_in_another_users_fallback_folder_is_refused(tmp_path, kernel):
    """The attack of the issue: $ATTNKIT_CACHE cannot be written, and another user created
    <tempdir>/attnkit-<uid>/kernels/ (or just attnkit-<uid>) first, holding a library of the
    predictable name and its record."""
    worlds = []
    for whose in ("kernels", "attnkit-uid"):
        for ownership in OWNERSHIP:
            world = World(tmp_path / f"{whose}-{ownership}", kernel, ownership == "simulated")
            world.block_cache()
            planted = world.plant(world.fallback, kernel["planted"])
            folder = world.fallback if whose == "kernels" else world.fallback.parent
            world.give_to_other_user(folder, planted, planted.with_name(planted.name + ".sha256"))
            worlds.append(world)
    for world, result in zip(worlds, load(kernel, worlds), strict=True):
        assert_planted_never_ran(world, result)
        refusal = [line for line in result["err"] if f"owned by uid {OTHER_UID}" in line]
        assert len(refusal) == 1 and "not using" in refusal[0], result["err"]
        assert len(world.builds()) == 1  # built once, for this process, somewhere private
        planted = world.fallback / world.name
        assert planted.read_bytes() == kernel["planted"].read_bytes()  # left alone


def test_fallback_folder_others_may_write_is_refused(tmp_path, kernel):
    """A folder of this user's that others may write (mode 0777, not sticky): anyone could
    have put the library and its record there."""
    worlds = []
    for which in ("kernels", "attnkit-uid"):
        world = World(tmp_path / which, kernel)
        world.block_cache()
        world.plant(world.fallback, kernel["planted"])
        (world.fallback if which == "kernels" else world.fallback.parent).chmod(0o777)
        worlds.append(world)
    whose = ("kernels", "attnkit-uid")
    for world, which, result in zip(worlds, whose, load(kernel, worlds), strict=True):
        assert_planted_never_ran(world, result)
        folder = world.fallback if which == "kernels" else world.fallback.parent
        refusal = [line for line in result["err"] if "may be written by" in line]
        assert len(refusal) == 1 and f"{folder} may be" in refusal[0], result["err"]


def test_another_users_library_in_the_private_cache_is_rebuilt(tmp_path, kernel):
    worlds = [World(tmp_path / o, kernel, o == "simulated") for o in OWNERSHIP]
    for world in worlds:
        world.cache.mkdir(parents=True, mode=0o700)
        world.give_to_other_user(world.plant(world.cache, kernel["planted"]))
    for world, result in zip(worlds, load(kernel, worlds), strict=True):
        assert not world.marker.exists() and result["abi"] == ABI
        assert [line for line in result["err"] if "again" in line] == [
            f"attnkit: {world.library} is owned by uid {OTHER_UID}, not by you "
            f"(uid {os.geteuid()}); compiling the CPU attention kernel again ..."
        ]
        assert len(world.builds()) == 1
        assert world.library.read_bytes() == kernel["built"].read_bytes()
        assert world.library.stat().st_uid == os.geteuid()  # replaced by this user's own


def _planted(world: World) -> None:
    """A whole, loadable library in place of the one built (same owner, the old record)."""
    world.library.write_bytes(world.kernel["planted"].read_bytes())


def _cut(world: World) -> None:
    data = world.library.read_bytes()
    world.library.write_bytes(data[: len(data) // 2])


DAMAGE = {
    # what a full disk or a killed copy leaves: the library cut short (dlopen: SIGBUS)
    "truncated": _cut,
    "empty": lambda w: w.library.write_bytes(b""),
    "random bytes": lambda w: w.library.write_bytes(os.urandom(w.library.stat().st_size)),
    "another library": _planted,
    # a library of an older attnkit, which recorded no hash
    "no record": lambda w: w.record.unlink(),
    "garbled record": lambda w: w.record.write_text("not a hash\n"),
}


def test_damaged_library_is_rebuilt_with_one_line_and_no_crash(tmp_path, kernel):
    worlds = []
    for name, damage in DAMAGE.items():
        world = World(tmp_path / name.replace(" ", "-"), kernel)
        world.seed_cache()
        damage(world)
        worlds.append(world)
    for name, world, result in zip(DAMAGE, worlds, load(kernel, worlds), strict=True):
        assert result["abi"] == ABI and not world.marker.exists(), name
        again = [line for line in result["err"] if "kernel again" in line]
        assert len(again) == 1 and str(world.library) in again[0], (name, result["err"])
        assert all(line.startswith("attnkit: ") for line in result["err"]), result["err"]
        assert len(world.builds()) == 2, name  # the seed, and the rebuild
        data = world.library.read_bytes()
        assert data == kernel["built"].read_bytes(), name
        want = f"{hashlib.sha256(data).hexdigest()}  {world.name}\n"
        assert world.record.read_text() == want, name


def test_first_load_builds_into_a_private_cache_and_the_next_loads_silently(tmp_path, kernel):
    first, intact = World(tmp_path / "first", kernel), World(tmp_path / "intact", kernel)
    intact.seed_cache()
    built, loaded = load(kernel, [first, intact])
    assert built["abi"] == ABI and len(first.builds()) == 1
    for folder in (first.cache, first.cache.parent):
        assert folder.stat().st_mode & 0o777 == 0o700  # created private
    for path in (first.library, first.record):
        assert path.stat().st_mode & 0o077 == 0
    assert loaded["abi"] == ABI and loaded["err"] == [] and len(intact.builds()) == 1
    assert str(intact.library) in loaded["mapped"]
