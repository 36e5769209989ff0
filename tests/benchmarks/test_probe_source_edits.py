"""The source-edit probe (GPU-only to time): every variant's edits apply to today's kernels exactly once,
and each edited module computes what the kept one does, checked in Triton's interpreter at small heads
against the float64 serial recurrence (a tree of depth 12 among them: the padded depth is 16)."""

import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import _bench_util as U  # noqa: E402
import probe_source_edits as P  # noqa: E402

from trtllm_bole.kernels import gdn_tree_verify_inverse as inv  # noqa: E402
from trtllm_bole.testing import topk_parents  # noqa: E402


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    path = tmp_path_factory.mktemp("edits")
    sys.path.insert(0, str(path))
    yield path
    sys.path.remove(str(path))


@pytest.mark.parametrize("name", list(P.VARIANTS))
def test_edited_kernels_match_the_serial_recurrence(name, folder):
    module = P.edited_module(name, P.VARIANTS[name], folder)
    assert module is not inv and module.__name__ == f"{name}_verify"
    assert module._path_factors is sys.modules[f"{name}_factors"]._path_factors  # the edited helpers
    gen = torch.Generator().manual_seed(0)
    trees = [topk_parents(40, 2, 12), topk_parents(33, 4, 6)]
    x = U.make_inputs(U.tree_of(trees, "cpu"), 2, 4, 32, 64, torch.float32, gen)
    exact = U.exact_outputs(x)
    # two launches (the factor kernel, then the value tiles in dk chunks: the state edits' load), and one
    for cfg in (inv.InverseConfig(64, 16, 32, 4, 2, 4), inv.InverseConfig(64, 32, 32, 4, 1, 4)):
        outputs, args, consts = module.inverse_launch_args(x.call("ieee"), cfg)
        for t in outputs:
            t.fill_(float("nan"))
        U.path_launcher(module, cfg, 4, 2)((outputs, args, consts))
        assert U.rel_rms(outputs[0], exact[0]) < 1e-5 and U.rel_rms(outputs[1], exact[2]) < 1e-5


def test_an_edit_that_matches_nothing_or_twice_is_refused(folder):
    with pytest.raises(ValueError, match="occurs 0 times"):
        P.edited_module("nothing", [(P.FACTORS, "no such text", "x")], folder)
    with pytest.raises(ValueError, match="occurs 2 times"):  # _state_dot's load and _state_dots'
        P.edited_module("twice", [(P.VERIFY, P.STATE_LOAD, P.STATE_LOAD)], folder)


def test_refuses_to_run_without_a_gpu(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert P.main([]) == 2
    assert "needs CUDA" in capsys.readouterr().err


@pytest.mark.parametrize(
    "args", [["--variants", "no_such_edit"], ["--depth", "17"], ["--batches", "3"], ["--batches", "x"]]
)
def test_refuses_options_it_cannot_run_by_name(args, capsys):
    with pytest.raises(SystemExit) as exit_:
        P.main(args)
    assert exit_.value.code == 2 and f"argument {args[0]}" in capsys.readouterr().err
