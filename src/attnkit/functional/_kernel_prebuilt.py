"""The compiled kernels a wheel carries (built ahead of time by hatch_build.py), for machines
with no C++ compiler: the best one this CPU can run, if it was built from the installed source.

``_native/prebuilt/manifest.json`` names one library per instruction set with the CPU flags
its code may use, and the sha256 of the sources it was compiled from (`sources_sha256`: every
.cpp and .h of ``_native/``, by name, in order; hatch_build.py computes the same). A library
is a candidate when this CPU has all its flags and the sources beside it are unchanged (an
edited checkout compiles its own); the widest (AVX-512 before AVX2) is loaded. These files
came with the installed package, so they are trusted as its Python code is; a library that
the loader refuses (an older glibc than the build machine's) passes to the next, then to the
JIT build.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from attnkit._cpu import cpu_flags

__all__ = ["candidates", "sources_sha256"]

PREBUILT = Path(__file__).with_name("_native") / "prebuilt"
ORDER = ("avx512", "avx2")  # the widest first


def sources_sha256(folder: Path) -> str:
    """One sha256 over the kernel's sources in `folder` (its .cpp and .h files, sorted)."""
    digest = hashlib.sha256()
    for path in sorted(p for p in folder.iterdir() if p.suffix in (".cpp", ".h")):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def candidates(source: Path, flags: frozenset[str] | None = None) -> list[tuple[str, Path]]:
    """(isa, library) pairs this CPU can run, best first; [] without a usable manifest.
    `source`: the kernel's main file; the sources beside it are hashed with it."""
    try:
        manifest = json.loads((PREBUILT / "manifest.json").read_text())
        libraries = manifest["libraries"]
        wanted = manifest["sources_sha256"]
    except (OSError, ValueError, KeyError, TypeError):
        return []
    if not isinstance(libraries, dict) or sources_sha256(source.parent) != wanted:
        return []
    have = cpu_flags() if flags is None else flags
    found = []
    for isa in ORDER:
        entry = libraries.get(isa)
        if not isinstance(entry, dict):
            continue
        path = PREBUILT / str(entry.get("file", ""))
        if path.is_file() and set(entry.get("cpu_flags", ["?"])) <= have:
            found.append((isa, path))
    return found
