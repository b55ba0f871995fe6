"""The decode rows of `attnkit bench` and benchmarks/bench_decode.py: structure and parity only."""

import torch

from attnkit.analysis.bench import time_interleaved
from attnkit.analysis.bench_decode import DecodeShape, PlainGPT, decode_rows, plain_generate
from attnkit.models import GPT, GPTConfig, KVCache, generate


def test_plain_gpt_with_copied_weights_equals_attnkit_gpt_cached_and_not():
    torch.manual_seed(0)
    gpt = GPT(GPTConfig(vocab_size=17, n_layer=2, n_head=2, d_model=16, context=12)).eval()
    plain = PlainGPT(gpt).eval()
    x = torch.randint(0, 17, (3, 9))
    with torch.no_grad():
        cache, ours = plain.new_cache(3), gpt(x)
        steps = [plain(x[:, :5], cache, 0)] + [
            plain(x[:, i : i + 1], cache, i) for i in range(5, 9)
        ]
    torch.testing.assert_close(torch.cat(steps, 1), ours, atol=1e-5, rtol=0)
    assert torch.equal(plain_generate(plain, x[:, :4], 8), generate(gpt, x[:, :4], 8))


def test_decode_rows_report_tokens_per_second_and_cache_memory():
    shape = DecodeShape(1, 2, 8, 16, vocab=11, prompt=3, new_tokens=4, batches=(1, 2))
    rows = decode_rows(shape, 1, time_interleaved)
    assert [r["batch"] for r in rows] == [1, 2]
    for r in rows:
        assert r["kind"] == "decode" and r["same_tokens"]
        assert set(r["tokens_per_s"]) == {"attnkit", "plain"}
        assert all(v > 0 for v in r["tokens_per_s"].values())
        # K and V, one layer, (B, H=2, S_max=16, Dh=4) float32: both caches are preallocated
        want = 2 * r["batch"] * 2 * 16 * 4 * 4 / 2**20
        assert r["cache_mib"] == {"attnkit": want, "plain": want}


def test_kvcache_nbytes_counts_what_it_holds():
    cache = KVCache()
    k = torch.zeros(2, 3, 5, 4)
    cache.append("m", k, k)
    assert cache.nbytes() == 2 * k.numel() * 4
