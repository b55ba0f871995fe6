"""benchmarks/bench_packing.py: the batches each mode trains on, and one step of each."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import torch

from attnkit.models import GPTConfig

SCRIPT = Path(__file__).parents[2] / "benchmarks" / "bench_packing.py"


def _script():
    spec = importlib.util.spec_from_file_location("bench_packing", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_mode_trains_on_the_same_documents_and_counts_real_tokens():
    bench = _script()
    docs = [torch.arange(n) % 7 for n in (3, 12, 5, 1, 9, 20, 2)]
    width, pad_id = 8, 7
    for mode in bench.MODES:
        data = bench.batches(mode, docs, width, 4, 3, pad_id)
        assert len(data) == 3
        for ids, document_ids, real in data:
            assert ids.shape[0] == 4 and ids.shape[1] <= width
            if mode == "packed":
                assert ids.shape[1] == width and real == ids.numel()
                assert document_ids.shape == ids.shape
            else:
                assert document_ids is None
                assert real == int((ids != pad_id).sum())  # every id of a document is < 7
            if mode in ("padded, context", "windows"):
                assert ids.shape[1] == width
        step = bench.make_step(GPTConfig(8, 1, 2, 8, width, pad_id=pad_id), 1e-3, data)
        step()  # one optimizer step on the first batch
    rows = [{"mode": m, "tokens_per_step": 10, "padding": 0.5, "ms_per_step": 2.0,
             "tokens_per_s": 5000.0} for m in bench.MODES]  # fmt: skip
    shape = {"layers": 1, "heads": 2, "d_model": 8, "context": 7, "batch": 4}
    lines = bench.markdown(rows, shape)
    assert len(lines) == 2 + len(bench.MODES) and "1.00×" in lines[-1]
