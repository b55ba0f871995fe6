"""Pages that train print what they show on every CPU, not only on the machine that wrote them.

CI lands on AVX2 (AMD EPYC), AVX-512 (Ice Lake) or AMX (Sapphire Rapids) machines. Their
vector kernels, and the number of threads, add float32 sums in other orders; a few hundred
training steps grow those last bits into another trajectory. A page whose code trains must
therefore print checks or bands that hold on every machine (CONTRIBUTING.md, "Pages whose
output comes from training"). This test runs each such page again in a fresh process under
everything that stands in for another CPU at once: torch's AVX2 kernels
(ATEN_CPU_CAPABILITY=avx2, close to what an EPYC runs), oneDNN off, and 1 thread instead of
the pages' 2; the page must still print exactly what it shows.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.docs.pages import DOCS, ROOT, pages, parse

# An optimizer step in a page's code: the page trains.
_TRAINS = re.compile(r"\.step\(\)")


def training_pages() -> list[Path]:
    found = []
    for page in pages("en"):
        blocks = parse(page.read_text(encoding="utf-8"))
        if any(b.kind == "python" and _TRAINS.search(b.code) for b in blocks):
            found.append(page)
    return found


_SCRIPT = """
import sys
from pathlib import Path

import torch

import tests.docs.pages as pages

torch.backends.mkldnn.enabled = False
pages.PAGE_THREADS = 1
page, work = Path(sys.argv[1]), Path(sys.argv[2])
bad = pages.mismatches(page, pages.run(page, work))
print("\\n\\n".join(bad))
sys.exit(1 if bad else 0)
"""


def test_the_training_pages_are_found():
    found = {str(p.relative_to(DOCS / "en")) for p in training_pages()}
    assert {"tutorials/06-transformer.md", "tutorials/08-seeing-attention.md"} <= found


@pytest.mark.slow
@pytest.mark.parametrize("page", training_pages(), ids=lambda p: str(p.relative_to(DOCS / "en")))
def test_training_page_prints_the_same_with_other_kernels_and_threads(page, tmp_path):
    env = dict(
        os.environ,
        ATEN_CPU_CAPABILITY="avx2",
        OMP_NUM_THREADS="1",
        MPLBACKEND="Agg",
        PYTHONPATH=os.pathsep.join([str(ROOT / "src"), str(ROOT)]),
    )
    done = subprocess.run(
        [sys.executable, "-c", _SCRIPT, str(page), str(tmp_path)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert done.returncode == 0, (
        f"{page.relative_to(ROOT)} prints something else with torch's AVX2 kernels, oneDNN "
        f"off and 1 thread (another CPU would too):\n{done.stdout[-4000:]}{done.stderr[-3000:]}"
    )
