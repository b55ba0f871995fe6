"""Session-wide settings that must not depend on the machine the suite runs on.

Torch threads. torch starts with one intra-op thread per core, so the same test would run
with 2 threads on a 2-core CI machine and 16 on a workstation; a float32 sum splits
differently over another number of threads, and anything trained for a few hundred steps
then prints other numbers. Every test module therefore starts with `TEST_THREADS` threads
(1 unless ATTNKIT_TEST_THREADS says otherwise), set by the autouse fixture below before the
module's first test, whatever the machine and whatever the module before it left. One, because
the suite's small problems run fastest on one thread of a shared, loaded CPU, and because it
is what a whole run has used so far (five analysis modules set it at import, during
collection); the documentation pages pin their own 2 (`tests/docs/pages.py`), the count
their outputs were made with. A module that wants another count says so with
`pytestmark = pytest.mark.threads(2)` (not a module-level `torch.set_num_threads`, which
runs at collection and would leak into every other module). `python3 dev.py test` also sets
OMP_NUM_THREADS to the same count, so the commands and scripts the tests start in
subprocesses begin with it too.
"""

from __future__ import annotations

import os

import pytest
import torch

TEST_THREADS = int(os.environ.get("ATTNKIT_TEST_THREADS", "1"))


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "threads(n): torch threads for the module's tests (default TEST_THREADS)"
    )
    torch.set_num_threads(TEST_THREADS)


def pytest_report_header(config: pytest.Config) -> str:
    cpu = torch.backends.cpu.get_cpu_capability()
    return f"attnkit: torch threads pinned to {TEST_THREADS} per test module; CPU kernels {cpu}"


@pytest.fixture(autouse=True, scope="module")
def _pinned_threads(request: pytest.FixtureRequest):
    """Every test module starts with the same torch thread count on every machine."""
    marker = request.node.get_closest_marker("threads")
    threads = int(marker.args[0]) if marker else TEST_THREADS
    torch.set_num_threads(threads)
    yield
    torch.set_num_threads(TEST_THREADS)
