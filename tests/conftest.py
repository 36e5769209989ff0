import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # the kernels' CI runs in Triton's interpreter


@pytest.fixture
def gen() -> torch.Generator:
    return torch.Generator().manual_seed(0)


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU; runs on the H200 via benchmarks/ scripts")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
