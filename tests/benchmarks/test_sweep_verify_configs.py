"""The config sweep (GPU-only to time): its candidates are what the launcher accepts, and it refuses to
run without a GPU instead of timing the interpreter."""

import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import sweep_verify_configs as S  # noqa: E402

from trtllm_bole.kernels import gdn_tree_verify as K  # noqa: E402


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_candidates_are_configs_the_launcher_accepts(dtype):
    for dims in S.DIMS.values():
        dk, dv = dims[2:]
        pairs = S.candidates(dk, dv, dtype)
        assert pairs and {p for _, p in pairs} == ({"ieee"} if dtype == torch.float32 else {"bf16", "tf32"})
        for cfg, precision in pairs:
            assert dk % cfg.bk == 0 and dv % cfg.bv == 0
            if isinstance(cfg, K.InverseConfig):
                K.check_inverse_config(cfg, precision)  # raises for a refused pair
        assert K.exact_config(dk, dv) in {cfg for cfg, _ in pairs}


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without a GPU")
def test_refuses_to_run_without_a_gpu(tmp_path, capsys):
    with pytest.raises(SystemExit):
        S.main(["--out", str(tmp_path)])
    assert "needs a CUDA GPU" in capsys.readouterr().err
