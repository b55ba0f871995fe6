"""torch.compile(fullgraph=True) of every module and model agrees with eager.

One compiled object per model serves eval, train (dropout on, with Inductor's
`fallback_random` so the compiled random draws are eager's) and `record_attention`.
"""

from __future__ import annotations

import pytest
import torch
import torch._dynamo
import torch._inductor.config as inductor_config

from attnkit import record_attention
from tests.deploy._models import NAMES, build, tokens

pytestmark = pytest.mark.slow
ATOL = 1e-5
# aot_eager traces the whole graph, forward and backward (what fullgraph checks); Inductor
# (the default backend) passed the same tests but takes ~30-60 s per model on a busy 2-core box.
BACKEND = "aot_eager"


def _first(out):
    """The output tensor of a forward (BertOutput: last_hidden_state)."""
    return getattr(out, "last_hidden_state", out)


def _run(m, args, kwargs, seed=0):
    torch.manual_seed(seed)
    return _first(m(*args, **kwargs))


@pytest.fixture(autouse=True)
def _same_rng():
    torch._dynamo.reset()
    with inductor_config.patch(fallback_random=True):
        yield


@pytest.mark.parametrize("name", NAMES)
def test_compile_fullgraph_matches_eager(name):
    m, args, kwargs = build(name)
    compiled = torch.compile(m, fullgraph=True, backend=BACKEND)
    for training in (False, True):
        m.train(training)
        got, want = _run(compiled, args, kwargs), _run(m, args, kwargs)
        assert not got.isnan().any()
        torch.testing.assert_close(got, want, atol=ATOL, rtol=ATOL)
    # recording the compiled model: the maps equal eager's (taken before dropout)
    m.eval()
    with record_attention(m) as eager_rec:
        want = _run(m, args, kwargs)
    with record_attention(m) as compiled_rec:
        got = _run(compiled, args, kwargs)
    torch.testing.assert_close(got, want, atol=ATOL, rtol=ATOL)
    assert compiled_rec.names == eager_rec.names and len(eager_rec) > 0
    for key in eager_rec.names:
        torch.testing.assert_close(compiled_rec[key], eager_rec[key], atol=ATOL, rtol=ATOL)


@pytest.mark.parametrize("name", ["bert", "causal-lm"])
@pytest.mark.parametrize("training", [False, True])
def test_plain_compile_has_no_graph_break(name, training):
    m, args, kwargs = build(name)
    m.train(training)
    explained = torch._dynamo.explain(m)(*args, **kwargs)
    assert explained.graph_break_count == 0, [b.reason for b in explained.break_reasons]
    assert explained.graph_count == 1


@pytest.mark.parametrize("name", ["causal-lm", "gpt"])
def test_cached_decoding_step_compiles(name):
    """A one-token step over a KVCache, compiled with fullgraph, equals the eager step (for
    the GPT in eval, its module-free step, `attnkit.models.gpt_step`)."""
    from attnkit.models import KVCache

    m, (prompt,), _ = build(name)
    m.eval()
    step = torch.compile(lambda tok, cache: m(tok, cache=cache), fullgraph=True, backend=BACKEND)
    eager_cache, compiled_cache = KVCache(), KVCache()
    m(prompt, cache=eager_cache)
    m(prompt, cache=compiled_cache)
    new = tokens(2, 1)
    for _ in range(2):
        got, want = step(new, compiled_cache), m(new, cache=eager_cache)
        torch.testing.assert_close(got, want, atol=ATOL, rtol=ATOL)
        assert compiled_cache.length == eager_cache.length
        new = want[:, -1:].argmax(-1)  # (B, 1)
