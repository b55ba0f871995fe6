import itertools

import pytest
import torch

from attnkit import MultiHeadAttention, record_attention
from attnkit.vision import (
    SwinBlock,
    WindowAttention,
    relative_position_index,
    window_mask,
    window_partition,
    window_reverse,
)


@pytest.mark.parametrize("b, h, w, m", [(2, 8, 8, 4), (1, 6, 9, 3), (3, 7, 7, 7), (1, 4, 4, 1)])
def test_partition_then_reverse_is_identity(b, h, w, m):
    x = torch.randn(b, h, w, 5)
    win = window_partition(x, m)
    assert win.shape == (b * (h // m) * (w // m), m * m, 5)
    torch.testing.assert_close(window_reverse(win, m, h, w), x)
    # the first window is the top-left M × M block, row-major
    torch.testing.assert_close(win[0], x[0, :m, :m].reshape(m * m, 5))


def test_partition_refuses_grid_not_multiple_of_window():
    with pytest.raises(ValueError, match="multiple of window_size=4"):
        window_partition(torch.randn(1, 6, 8, 2), 4)


def test_relative_position_index_depends_only_on_offset():
    m = 3
    idx = relative_position_index(m)
    assert idx.shape == (m * m, m * m)
    assert idx.min() == 0 and idx.max() == (2 * m - 1) ** 2 - 1
    coords = [(i // m, i % m) for i in range(m * m)]
    seen = {}
    for i, j in itertools.product(range(m * m), repeat=2):
        offset = (coords[i][0] - coords[j][0], coords[i][1] - coords[j][1])
        assert seen.setdefault(offset, int(idx[i, j])) == int(idx[i, j])
    assert len(set(seen.values())) == (2 * m - 1) ** 2  # distinct offsets, distinct entries


def _brute_force_mask(h, w, m, s, mask_padding=True):
    """Per window, may (query, key) attend? Built pair by pair from region labels.

    After padding to Hp × Wp and rolling by -s, the token at rolled row r came
    from original row (r + s) mod Hp; it "wrapped" if r + s >= Hp. Two tokens of
    a window were neighbours before the roll iff they wrapped alike on both
    axes; keys from the padding are never allowed.
    """
    hp, wp = -(-h // m) * m, -(-w // m) * m
    masks = []
    for wy, wx in itertools.product(range(hp // m), range(wp // m)):
        cells = [(wy * m + dy, wx * m + dx) for dy in range(m) for dx in range(m)]
        mask = torch.zeros(m * m, m * m, dtype=torch.bool)
        for (i, (qy, qx)), (j, (ky, kx)) in itertools.product(enumerate(cells), repeat=2):
            same = (qy + s >= hp) == (ky + s >= hp) and (qx + s >= wp) == (kx + s >= wp)
            real = ((ky + s) % hp < h and (kx + s) % wp < w) or not mask_padding
            mask[i, j] = same and real
        masks.append(mask)
    return torch.stack(masks)


@pytest.mark.parametrize("h, w, m, s", [(8, 8, 4, 2), (6, 6, 3, 1), (7, 5, 3, 1), (7, 9, 4, 0)])
def test_window_mask_equals_brute_force(h, w, m, s):
    torch.testing.assert_close(window_mask(h, w, m, s), _brute_force_mask(h, w, m, s))


@pytest.mark.parametrize("h, w, m, s", [(6, 6, 3, 1), (7, 5, 3, 1), (7, 9, 4, 2)])
def test_window_mask_without_padding_mask_equals_brute_force(h, w, m, s):
    got = window_mask(h, w, m, s, mask_padding=False)
    torch.testing.assert_close(got, _brute_force_mask(h, w, m, s, mask_padding=False))


def test_window_mask_none_when_nothing_masked():
    assert window_mask(8, 8, 4, 0) is None
    assert window_mask(7, 5, 3, 0, mask_padding=False) is None  # padding attended, no shift


def _global_equivalent(wa: WindowAttention, x: torch.Tensor) -> torch.Tensor:
    """The same attention run over all H·W tokens at once with a slow block-diagonal mask."""
    b, h, w, c = x.shape
    m, s = wa.window_size, wa.shift
    hp, wp = -(-h // m) * m, -(-w // m) * m
    xp = torch.nn.functional.pad(x, (0, 0, 0, wp - w, 0, hp - h))
    xr = torch.roll(xp, (-s, -s), dims=(1, 2)).reshape(b, hp * wp, c)  # (B, Hp·Wp, C)
    table = wa.bias_table.detach()
    n = hp * wp
    allowed = torch.zeros(n, n, dtype=torch.bool)
    bias = torch.zeros(table.shape[1], n, n)
    for i, j in itertools.product(range(n), repeat=2):
        (qy, qx), (ky, kx) = divmod(i, wp), divmod(j, wp)
        if qy // m != ky // m or qx // m != kx // m:
            continue
        wrap_same = (qy + s >= hp) == (ky + s >= hp) and (qx + s >= wp) == (kx + s >= wp)
        real = ((ky + s) % hp < h and (kx + s) % wp < w) or wa.pad_attends
        allowed[i, j] = wrap_same and real
        rel = (qy - ky + m - 1) * (2 * m - 1) + (qx - kx + m - 1)
        bias[:, i, j] = table[rel]
    out = wa.attn(xr, mask=allowed, bias=bias).reshape(b, hp, wp, c)
    return torch.roll(out, (s, s), dims=(1, 2))[:, :h, :w]


@pytest.mark.parametrize("h, w, m, s", [(8, 8, 4, 0), (8, 8, 4, 2), (5, 7, 3, 1), (6, 6, 2, 1)])
def test_window_attention_equals_masked_global_attention(h, w, m, s):
    torch.manual_seed(0)
    wa = WindowAttention(12, 3, m, shift=s)
    with torch.no_grad():
        wa.bias_table.normal_()  # large enough to matter
    x = torch.randn(2, h, w, 12)
    torch.testing.assert_close(wa(x), _global_equivalent(wa, x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("h, w, m, s", [(5, 7, 3, 0), (5, 7, 3, 1), (4, 5, 3, 1)])
def test_pad_attends_equals_global_attention_over_zero_padding(h, w, m, s):
    """pad_attends=True: the zero padding tokens are keys (reference Swin, Hugging Face)."""
    torch.manual_seed(0)
    wa = WindowAttention(12, 3, m, shift=s, pad_attends=True)
    with torch.no_grad():
        wa.bias_table.normal_()
    x = torch.randn(2, h, w, 12)
    torch.testing.assert_close(wa(x), _global_equivalent(wa, x), rtol=1e-5, atol=1e-5)
    masked = WindowAttention(12, 3, m, shift=s)
    masked.load_state_dict(wa.state_dict())
    assert not torch.allclose(masked(x), wa(x), atol=1e-4)  # the padding changes the output


def test_padded_grid_stays_finite_with_gradients():
    # 5 × 6 with M = 4 pads to 8 × 8; some padded queries see no real key
    wa = WindowAttention(8, 2, 4, shift=2)
    x = torch.randn(1, 5, 6, 8, requires_grad=True)
    y = wa(x)
    assert y.shape == x.shape and torch.isfinite(y).all()
    y.sum().backward()
    assert torch.isfinite(x.grad).all()


def test_record_attention_sees_window_maps():
    wa = WindowAttention(8, 2, 4, shift=2)
    with record_attention(wa) as rec:
        wa(torch.randn(3, 8, 8, 8))
    maps = rec["attn"]
    assert maps.shape == (3 * 4, 2, 16, 16)
    torch.testing.assert_close(maps.sum(-1), torch.ones(12, 2, 16))
    mask = window_mask(8, 8, 4, 2).repeat(3, 1, 1).unsqueeze(1)
    assert (maps[~mask.expand_as(maps)] == 0).all()


def test_swin_block_shapes_and_gradients():
    blocks = torch.nn.Sequential(SwinBlock(16, 2, 4), SwinBlock(16, 2, 4, shift=2))
    x = torch.randn(2, 9, 10, 16, requires_grad=True)
    y = blocks(x)
    assert y.shape == x.shape
    y.sum().backward()
    assert all(p.grad is not None for p in blocks.parameters())
    assert isinstance(blocks[0].attn.fn.attn, MultiHeadAttention)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (
            {"window_size": 4, "shift": 4},
            r"shift must be an integer in \[0, window_size=4\), got 4",
        ),
        ({"window_size": 0}, "window_size must be a positive integer, got 0"),
    ],
)
def test_window_attention_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        WindowAttention(8, 2, **kwargs)


def test_window_attention_refuses_wrong_width():
    with pytest.raises(ValueError, match=r"\(B, H, W, 8\), got \(1, 4, 4, 6\)"):
        WindowAttention(8, 2, 2)(torch.randn(1, 4, 4, 6))
