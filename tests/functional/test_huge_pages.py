"""`_huge_pages.empty_hinted`: a plain empty tensor everywhere, hinted as huge pages on Linux."""

import sys

import pytest
import torch

from attnkit.functional._huge_pages import empty_hinted


def _vm_flags(address: int) -> list[str]:
    """The VmFlags of the mapping holding `address` (/proc/self/smaps)."""
    inside, flags = False, None
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()[0]
            if "-" in head and ":" not in head:
                lo, hi = (int(x, 16) for x in head.split("-"))
                inside = lo <= address < hi
            elif inside and head == "VmFlags:":
                flags = line.split()[1:]
    assert flags is not None, f"no mapping holds {address:#x}"
    return flags


@pytest.mark.parametrize(
    ("shape", "dtype"),
    [((2, 3, 5, 7), torch.float32), ((0, 4), torch.float64), ((9,), torch.int64)],
)
def test_shape_dtype_and_device_follow_like(shape, dtype):
    like = torch.zeros(shape, dtype=dtype).transpose(0, -1)  # not contiguous: out is
    out = empty_hinted(like)
    assert out.shape == like.shape and out.dtype == dtype and out.is_contiguous()


def test_meta_and_default_device():
    like = torch.empty(8, 16384, 64, device="meta")
    assert empty_hinted(like).device.type == "meta"
    with torch.device("meta"):
        assert empty_hinted(torch.empty(3, 4)).device.type == "meta"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="madvise and smaps are Linux's")
def test_large_tensor_is_hinted_small_one_not():
    big = empty_hinted(torch.empty(8, 16384, 64))  # 32 MiB: glibc maps it fresh
    middle = big.data_ptr() + big.numel() * big.element_size() // 2
    assert "hg" in _vm_flags(middle)
    small = empty_hinted(torch.empty(1024))  # 4 KiB: on the heap, left alone
    assert small.numel() == 1024


@pytest.mark.parametrize("backend", ["aot_eager"])
def test_a_compiled_neighbourhood_gathers_like_eager(backend):
    """torch.compile traces the reordered path's gathers on tensors without memory (fake
    tensors): at 4 MiB a tensor, the size the hint starts at, the compiled call still runs
    and equals eager."""
    import attnkit
    from attnkit import masks

    mask = masks.neighborhood_2d(64, 64, 7)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 8, 4096, 32, generator=g) for _ in range(3))

    def run(q, k, v):
        return attnkit.attention(q, k, v, mask=mask, backend="chunked").out

    torch.testing.assert_close(torch.compile(run, backend=backend)(q, k, v), run(q, k, v))
