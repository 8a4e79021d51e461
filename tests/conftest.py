"""Test setup: without a GPU, Triton kernels run under the interpreter (set before triton loads)."""
import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)



@pytest.fixture
def fresh_compiler():
    """A clean Dynamo cache, rewrite counters and op registry for one test (and Dynamo reset after it)."""
    import replay_compile  # noqa: PLC0415  (after TRITON_INTERPRET is set)
    from replay_compile.ops import scoped_registry  # noqa: PLC0415
    torch._dynamo.reset()
    replay_compile.reset_counters()
    with scoped_registry():
        yield
    torch._dynamo.reset()


@pytest.fixture
def one_thread():
    """Tiny tensors: a second intra-op thread only adds synchronisation (much slower on a busy 2-core box)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
