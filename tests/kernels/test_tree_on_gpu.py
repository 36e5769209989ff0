"""A forest built from CUDA tensors: the metadata derived on the host reaches the GPU intact, in one
packed buffer whose views start on 128-byte boundaries (what the kernels' pointers are specialised on)."""

import dataclasses

import pytest
import torch

from trtllm_bole.testing import chain_parents, star_parents, topk_parents
from trtllm_bole.tree import TreeBatch


@pytest.mark.gpu
def test_cuda_build_matches_the_host_build():
    trees = [topk_parents(64, 4, 8), chain_parents(9), star_parents(5), [-1]]
    parents = torch.tensor([p for t in trees for p in t])
    cu = torch.tensor([0, *[len(t) for t in trees]]).cumsum(0)
    host = TreeBatch.build(parents, cu)
    cuda = TreeBatch.build(parents.cuda().int(), cu.cuda())
    for field in dataclasses.fields(host):
        a, b = getattr(host, field.name), getattr(cuda, field.name)
        if isinstance(a, torch.Tensor):
            assert b.is_cuda and b.data_ptr() % 128 == 0 and torch.equal(a, b.cpu()), field.name
        else:
            assert a == b, field.name
    assert (cuda.max_depth, cuda.max_nodes) == (9, 64)
