import pytest
import torch


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Small models train ~10x faster on one thread than on two on a shared, loaded CPU."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
