"""Structured masks' sizes, ids and predicates checked where they enter (issue 39).

Before: a window of 2**63 - 1 wrapped around int64 and kept one key per row (2**63 + 5 kept
none, and `attention` returned zeros); a predicate that ignored its index arguments failed in
torch's `expand`; document ids and lengths of other dtypes, an empty list or a float `total`
failed inside torch; `batch=-1` / `heads=2.5` were accepted and failed later."""

from __future__ import annotations

import pytest
import torch

from attnkit import attention, masks

HUGE = [2**63 - 1, 2**63 + 5, 10**30]


@pytest.mark.parametrize("w", HUGE)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize(("n", "s"), [(16, 16), (5, 9), (9, 5), (1, 1)])
def test_a_window_wider_than_the_sequence_sees_every_key(w, causal, n, s):
    got = masks.window(n, w, s, causal=causal).dense()[0, 0]
    want = masks.window(n, n + s + 7, s, causal=causal).dense()[0, 0]  # wide, nowhere near int64
    assert torch.equal(got, want)
    assert bool(got.any(-1).all()) or n > s  # no row emptied (every row sees key 0 at least)


def test_a_huge_window_gives_what_no_mask_gives():
    q, k, v = torch.randn(3, 1, 2, 16, 8, dtype=torch.float64).unbind(0)
    for backend in ("reference", "chunked"):
        got = attention(q, k, v, mask=masks.window(16, 2**63 + 5), backend=backend).out
        want = attention(q, k, v, backend="reference").out
        torch.testing.assert_close(got, want)


@pytest.mark.parametrize("p", HUGE)
def test_a_prefix_longer_than_the_keys_is_every_key(p):
    assert bool(masks.prefix(16, p).dense().all())


def test_a_predicate_of_fixed_shape_is_named():
    def fixed(b, h, q_idx, kv_idx):
        return torch.ones(3, 3, dtype=torch.bool)

    q = torch.randn(1, 1, 8, 4)
    for backend in ("reference", "chunked", "auto"):
        with pytest.raises(ValueError, match=r"from_function\(fixed\): .* got \(3, 3\)"):
            attention(q, q, q, mask=masks.from_function(fixed, 8), backend=backend)


@pytest.mark.parametrize(("name", "value"), [("batch", -1), ("heads", 2.5), ("batch", True)])
def test_predicate_batch_and_heads_are_checked(name, value):
    with pytest.raises(ValueError, match=rf"from_function: {name} must be an integer >= 1"):
        masks.from_function(lambda b, h, q, kv: q >= kv, 8, **{name: value})


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int8, torch.int16, torch.int32])
def test_document_lengths_of_every_integer_dtype(dtype):
    ids = masks.document_ids(torch.tensor([2, 0, 3], dtype=dtype), total=6)
    assert ids.tolist() == [0, 0, 2, 2, 2, 3]
    assert int(masks.document(ids.to(dtype)).dense().sum()) == 4 + 9 + 1


def test_no_documents_is_an_empty_sequence():
    assert masks.document_ids([]).tolist() == []
    assert masks.document_ids([], total=3).tolist() == [0, 0, 0]  # all padding


@pytest.mark.parametrize("total", [2.5, True, "4"])
def test_a_total_that_is_not_an_integer_is_refused(total):
    with pytest.raises(ValueError, match="document_ids: total must be an integer"):
        masks.document_ids([1, 1], total=total)


def test_complex_ids_and_lengths_are_refused():
    z = torch.tensor([1 + 1j, 2 + 0j])
    with pytest.raises(ValueError, match="document: ids must be an integer tensor"):
        masks.document(z)
    with pytest.raises(ValueError, match="document_ids: lengths must be integers"):
        masks.document_ids(z)
