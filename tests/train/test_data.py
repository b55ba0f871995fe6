import torch

from attnkit.train.data import load_digits, random_shift


def test_digits_split_is_fixed_stratified_and_normalised():
    a, b = load_digits(), load_digits()
    assert (len(a.train), len(a.test)) == (1437, 360)
    torch.testing.assert_close(a.test.tensors[0], b.test.tensors[0])
    x, y = a.train.tensors
    assert x.shape == (1437, 1, 8, 8) and y.dtype == torch.long
    assert abs(x.mean().item()) < 1e-5 and abs(x.std().item() - 1) < 1e-4
    counts = torch.bincount(a.test.tensors[1], minlength=10)
    assert counts.min() >= 35 and counts.max() <= 37  # ~36 per class
    torch.testing.assert_close(a.to_pixels(x).amin(), torch.tensor(0.0), atol=1e-5, rtol=0)
    assert load_digits(seed=1).test.tensors[0].shape == (360, 1, 8, 8)
    assert not torch.equal(load_digits(seed=1).test.tensors[1], a.test.tensors[1])


def test_random_shift_moves_whole_images_and_fills_background():
    torch.manual_seed(0)
    x = torch.arange(2 * 3 * 36, dtype=torch.float32).view(2, 3, 6, 6)
    y = random_shift(x, 2, fill=-1.0)
    assert y.shape == x.shape
    for b in range(2):
        real = y[b] != -1
        # the kept pixels are a translated block of the original
        rows, cols = real[0].any(1).nonzero(), real[0].any(0).nonzero()
        dy_block = y[b][:, rows.min() : rows.max() + 1, cols.min() : cols.max() + 1]
        assert any(
            torch.equal(dy_block, x[b][:, r : r + dy_block.shape[1], c : c + dy_block.shape[2]])
            for r in range(6)
            for c in range(6)
        )
    assert torch.equal(random_shift(x, 0), x)
