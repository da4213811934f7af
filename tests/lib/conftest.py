import pytest
import torch


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """The library tests use tiny tensors: one thread is faster than several (and far faster
    on a loaded machine)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
