"""examples/speculative_decoding.py: greedy speculative decoding through replayssm == greedy decoding."""
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples"))
from replay_compile.testing import NoisyOracleDrafter  # noqa: E402
from replay_compile.toy import HybridLM  # noqa: E402
import speculative_decoding  # noqa: E402
from speculative_decoding import greedy, speculative  # noqa: E402


@pytest.fixture(autouse=True)
def _one_thread(one_thread):
    yield


def test_greedy_speculative_is_token_identical():
    torch.manual_seed(0)
    model = HybridLM(max_len=48).double().eval()
    prompts = torch.randint(0, 97, (3, 6))
    ref, ref_logits = greedy(model, prompts, 16)
    verify = torch.compile(model, backend="replayssm", options={"speculative": True, "window": 8, "inductor": False})
    drafter = NoisyOracleDrafter(ref, prompts.shape[1], 97)
    spec, logits, stats = speculative(model, verify, prompts, 16, drafter, T=3)
    assert torch.equal(spec, ref)
    torch.testing.assert_close(logits, ref_logits, rtol=0, atol=1e-9)
    assert 0 < stats["accepted"] < stats["drafted"]  # partial acceptance exercised the rollback
    assert stats["steps"] < 16  # fewer target calls than tokens


@pytest.mark.gpu
def test_example_on_gpu_is_logit_close():
    """The example end to end on the GPU (Triton replay kernels, Inductor): kept logits close to greedy's."""
    assert speculative_decoding.main(["--device", "cuda", "--dtype", "float32", "--tokens", "48", "--batch", "4",
                                      "--logit-tol", "1e-3"]) == 0
