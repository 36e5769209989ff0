"""The operator count: views are free, a ``bole::`` operator counts once, each count names its caller."""

import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import count_ops  # noqa: E402

from trtllm_bole import ops  # noqa: E402


def test_views_launch_nothing_and_an_operator_counts_once_at_its_caller():
    x, weight = torch.ones(4, 6), torch.zeros(6)
    with count_ops.OpCounter() as counted:
        y = x.view(6, 4).t().unsqueeze(0)[0] + 1  # the add alone launches
        ops.rms_norm(x, weight, 1e-6)  # bole::rms_norm, whatever its CPU reference runs
    assert dict(counted.by_op) == {"aten.add": 1, "bole.rms_norm": 1}
    outside, norm = counted.by_line
    assert outside == "outside the package"
    assert norm.startswith("ops/__init__.py:") and norm.endswith(" rms_norm")
    assert y.shape == (4, 6)


def test_counts_a_draft_and_a_prefill_of_the_embedded_model(tmp_path, capsys):
    count_ops.main(["--batch", "2", "--json", str(tmp_path / "counts.json")])
    counts = json.loads((tmp_path / "counts.json").read_text())
    for phase in ("draft", "prefill"):
        assert (
            counts[phase]["operators"]
            == sum(counts[phase]["by_op"].values())
            == sum(counts[phase]["by_line"].values())
            > 0
        )
    assert counts["prefill"]["by_op"]["bole.gdn_prefill"] == 6  # the embedded model's six GDN layers
    assert "greedy draft, batch 2" in capsys.readouterr().out
