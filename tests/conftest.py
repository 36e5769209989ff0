import os

import pytest
import torch

from tests.hopper_compile import Compiler, Launches

INTERPRETED = not torch.cuda.is_available()
if INTERPRETED:
    os.environ.setdefault("TRITON_INTERPRET", "1")  # the kernels' CI runs in Triton's interpreter
LAUNCHES, COMPILER = Launches(), Compiler()
if INTERPRETED and os.environ.get("BOLE_COMPILE_CHECK", "1") != "0":
    LAUNCHES.install()


@pytest.fixture(autouse=True)
def kernels_compile_for_hopper():
    """Each new launch of our kernels in this test, in Triton's interpreter, also compiles for sm_90
    (tests/hopper_compile.py; ``BOLE_COMPILE_CHECK=0`` skips it, as a GPU does)."""
    yield
    failures = COMPILER.failures(LAUNCHES.take())
    assert not failures, "launched in the interpreter, but Triton's compiler refuses:\n" + "\n".join(failures)


@pytest.fixture
def gen() -> torch.Generator:
    return torch.Generator().manual_seed(0)


def pytest_collection_modifyitems(config, items):
    if INTERPRETED:
        marker, reason = "gpu", "needs a CUDA GPU; runs on the H200 via benchmarks/ scripts"
    else:  # where TRITON_INTERPRET is unset, these would hand CPU tensors to compiled kernels
        marker, reason = "interpreter", "runs Triton's interpreter on CPU tensors; kernels run compiled here"
    for item in items:
        if marker in item.keywords:
            item.add_marker(pytest.mark.skip(reason=reason))


def pytest_unconfigure(config):
    COMPILER.close()
