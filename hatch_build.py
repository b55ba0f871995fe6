"""Wheel build hook: the CPU attention kernel compiled ahead of time, for several instruction
sets, so that a machine with no C++ compiler gets the fast kernel from the wheel.

For each target in `TARGETS` the kernel source is compiled into
``attnkit/functional/_native/prebuilt/attention_cpu-<isa>.so`` with a ``manifest.json`` that
records the sources' sha256, the ISA's required CPU flags and the compiler; at run time
`attnkit.functional._kernel_prebuilt` loads the best library whose flags this CPU has and whose
source hash matches the installed source (an edited source falls back to the JIT build).

The kernel calls BLAS ``sgemm_`` from ``libtorch_cpu.so`` and OpenMP from ``libgomp.so.1``,
both of which `import torch` has loaded before the kernel is opened: the dynamic loader matches
a needed library by its soname among those already loaded. So no torch is needed here: the
libraries link against a stub ``libtorch_cpu.so`` (one undefined-at-run-time symbol, its soname
the real one's). libstdc++ and libgcc are linked statically (no GLIBCXX version to match).

Builds with no C++ compiler, on other platforms, or with ``ATTNKIT_PREBUILT=0`` produce the
pure-Python wheel as before (one line says so); editable installs never compile here.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

SOURCE = Path("src/attnkit/functional/_native/attention_cpu.cpp")
PACKAGE_DIR = "attnkit/functional/_native/prebuilt"

# isa -> (gcc flags, the /proc/cpuinfo flags the code may use). x86-64-v3 is AVX2 + FMA (+ BMI,
# F16C, MOVBE, LZCNT); x86-64-v4 adds AVX-512 F/BW/CD/DQ/VL.
TARGETS = {
    "avx2": (
        ["-march=x86-64-v3", "-mtune=generic"],
        ["avx", "avx2", "fma", "bmi1", "bmi2", "f16c", "movbe", "abm"],
    ),
    "avx512": (
        ["-march=x86-64-v4", "-mtune=generic", "-mprefer-vector-width=512"],
        ["avx2", "fma", "bmi1", "bmi2", "avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"],
    ),
}
COMMON = ["-O3", "-fopenmp", "-fPIC", "-shared", "-std=c++17", "-static-libstdc++",
          "-static-libgcc", "-Wl,--no-undefined"]  # fmt: skip


def _say(line: str) -> None:
    print(f"attnkit build: {line}", file=sys.stderr, flush=True)


def _compiler() -> str | None:
    for name in (os.environ.get("CXX"), "g++", "c++"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


def _sources_sha256(folder: Path) -> str:
    """attnkit.functional._kernel_prebuilt.sources_sha256, which this hook cannot import (the
    build environment has no torch): the .cpp and .h files of `folder`, sorted, by name."""
    digest = hashlib.sha256()
    for path in sorted(p for p in folder.iterdir() if p.suffix in (".cpp", ".h")):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def _stub(cxx: str, folder: Path) -> None:
    """A libtorch_cpu.so with the soname of torch's, defining sgemm_ (never called)."""
    src = folder / "stub.cpp"
    src.write_text('extern "C" void sgemm_() {}\n')
    cmd = [cxx, str(src), "-shared", "-fPIC", "-Wl,-soname,libtorch_cpu.so",
           "-o", str(folder / "libtorch_cpu.so")]  # fmt: skip
    subprocess.run(cmd, check=True, capture_output=True, text=True)


def build_prebuilt(root: Path, out: Path) -> dict:
    """Compile every target into `out`; return the manifest written beside them."""
    cxx = _compiler()
    if cxx is None:
        raise RuntimeError("no C++ compiler (set CXX or install g++)")
    source = root / SOURCE
    out.mkdir(parents=True, exist_ok=True)
    manifest = {
        "sources_sha256": _sources_sha256(source.parent),
        "compiler": subprocess.run(
            [cxx, "--version"], capture_output=True, text=True
        ).stdout.splitlines()[0],
        "libraries": {},
    }
    with tempfile.TemporaryDirectory() as tmp:
        _stub(cxx, Path(tmp))
        for isa, (flags, needs) in TARGETS.items():
            name = f"attention_cpu-{isa}.so"
            cmd = [cxx, str(source), "-o", str(out / name), *flags, *COMMON, f"-L{tmp}",
                   "-ltorch_cpu"]  # fmt: skip
            done = subprocess.run(cmd, capture_output=True, text=True)
            if done.returncode:
                raise RuntimeError(f"{' '.join(cmd)}\n{done.stderr.strip()}")
            manifest["libraries"][isa] = {"file": name, "cpu_flags": needs, "flags": flags}
            _say(f"compiled the CPU attention kernel for {isa}")
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


class CustomBuildHook(BuildHookInterface):
    def initialize(self, version: str, build_data: dict) -> None:
        if self.target_name != "wheel" or version == "editable":
            return
        why = None
        if os.environ.get("ATTNKIT_PREBUILT", "1") == "0":
            why = "ATTNKIT_PREBUILT=0"
        elif sys.platform != "linux" or platform.machine() not in ("x86_64", "AMD64"):
            why = f"no prebuilt kernels for {sys.platform}/{platform.machine()}"
        elif _compiler() is None:
            why = "no C++ compiler here"
        if why is None:
            out = Path(self.directory) / "prebuilt-kernels"
            try:
                manifest = build_prebuilt(Path(self.root), out)
            except (RuntimeError, OSError, subprocess.CalledProcessError) as err:
                why = f"the kernel did not compile ({str(err).splitlines()[0]})"
            else:
                for name in [*(lib["file"] for lib in manifest["libraries"].values()),
                             "manifest.json"]:  # fmt: skip
                    build_data["force_include"][str(out / name)] = f"{PACKAGE_DIR}/{name}"
                build_data["pure_python"] = False
                build_data["tag"] = "py3-none-linux_x86_64"
                return
        _say(f"{why}: a pure-Python wheel (the kernel compiles on first use where it can)")
