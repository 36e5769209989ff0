"""The value-tile probe (GPU-only to time) edits copies of the kept kernel: each edit must still match
the kernel's source exactly once, the unedited copy must compute what the launcher computes, and an
edit must change what the kernel reads (checked in Triton's interpreter at small heads)."""

import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import _bench_util as U  # noqa: E402
import probe_value_bytes as P  # noqa: E402

from trtllm_bole.kernels import gdn_tree_verify_inverse as inv  # noqa: E402
from trtllm_bole.testing import topk_parents  # noqa: E402

CONFIG = inv.InverseConfig(16, 32, 16, 1, 2, 1)  # two launches, as the probe's config


def test_every_variant_edits_the_kept_kernel_and_nothing_else():
    kept = Path(inv.__file__).read_text()
    assert P.edited_source(()) == kept
    for name, edits in P.VARIANTS.items():
        lines = P.edited_source(edits).splitlines()
        changed = sum(a != b for a, b in zip(kept.splitlines(), lines, strict=True))
        assert changed == sum(len(P.EDITS[e]) for e in edits), name  # one line per edit


def _value_tiles(module, call):
    """The factors from the kept kernels, then ``module``'s value-tile kernel; returns o."""
    outputs, args, consts = inv.inverse_launch_args(call, CONFIG)
    hv, dv, batch = call.v.shape[1], call.v.shape[2], call.tree.num_requests
    kernel, grid, constexprs, options = inv.phase_launch(1, CONFIG, consts, hv, dv, batch)
    kernel[grid](*args, **constexprs, **options)
    kernel, grid, constexprs, options = module.phase_launch(2, CONFIG, consts, hv, dv, batch)
    kernel[grid](*args, **constexprs, **options)
    return outputs[0]


@pytest.mark.parametrize("variant", ["kq", "state"])
def test_the_unedited_copy_is_the_launcher_and_an_edit_reads_elsewhere(tmp_path, variant):
    gen = torch.Generator().manual_seed(0)
    x = U.make_inputs(U.tree_of([topk_parents(12, 4, 4)] * 2, "cpu"), 2, 4, 32, 32, torch.bfloat16, gen)
    expected = inv.launch_inverse(x.call("tf32"), CONFIG)[0]
    base = _value_tiles(P.load_variant("base", (), tmp_path), x.call("tf32"))
    assert torch.equal(base, expected)
    edited = _value_tiles(P.load_variant(variant, P.VARIANTS[variant], tmp_path), x.call("tf32"))
    assert not torch.allclose(edited, expected)  # request 1 read request 0's K and Q / state


def test_refuses_to_run_without_a_gpu(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert P.main([]) == 2
    assert "needs CUDA" in capsys.readouterr().err


def test_plot_only_redraws_the_committed_result(tmp_path):
    committed = ROOT / "benchmarks" / "results" / "probe_value_bytes_h200.json"
    copy = tmp_path / committed.name
    copy.write_text(committed.read_text())
    assert P.main(["--plot-only", str(copy)]) == 0
    assert copy.with_suffix(".png").stat().st_size > 10_000
