import json

import pytest

from trtllm_bole.spec.budget import BudgetEntry, BudgetTable, budget_from_timings, calibrate, timed_capacities


def test_budget_is_largest_capacity_within_epsilon():
    caps = [8, 16, 32, 64, 128]
    t_ver = [1.0, 1.05, 1.1, 1.3, 2.0]
    assert budget_from_timings(caps, t_ver, t_dec=1.0, epsilon=0.2) == 32
    assert budget_from_timings(caps, t_ver, t_dec=1.0, epsilon=0.3) == 64
    assert budget_from_timings(caps, t_ver, t_dec=0.5, epsilon=0.1) == 8  # none fits: smallest


def test_budget_rejects_bad_input():
    with pytest.raises(ValueError, match="equal length"):
        budget_from_timings([8], [], 1.0, 0.1)
    for epsilon in (-0.1, float("nan"), "0.2", True):
        with pytest.raises(ValueError, match="epsilon must be a number >= 0"):
            budget_from_timings([8], [1.0], 1.0, epsilon)
    assert budget_from_timings([8, 64], [1.0, 9.0], 1.0, float("inf")) == 64  # any verify cost fits
    with pytest.raises(ValueError, match="epsilon must be a number >= 0"):  # a NaN once gave every bucket
        BudgetTable(float("nan"), [8], 9, "cpu")  # its smallest budget, and an invalid budget.json


def test_lookup_at_a_bucket_s_edge_takes_that_bucket():
    """A bucket covers its bounds inclusively: a KV length on an edge is that bucket's, one past it the
    next one's."""
    entries = [BudgetEntry(1, 256, 16, 1.0, [1.0, 1.0]), BudgetEntry(1, 1024, 8, 1.0, [1.0, 2.0])]
    table = BudgetTable(0.2, [8, 16], 8, "test", entries)
    assert [table.lookup(1, kv) for kv in (256, 257, 1024)] == [16, 8, 8]


def test_another_epsilon_keeps_a_capacity_equal_to_the_batch_bucket():
    """Re-deriving budgets at another epsilon keeps every capacity the bucket's batch can fill (one
    equal to the batch bucket included) and refuses none."""
    table = calibrate(
        lambda batch, kv, n: 1e-3, lambda batch, kv: 1e-3, device="fake", max_depth=8, epsilon=0.0,
        capacities=[8, 16, 64], batch_buckets=[8], kv_buckets=[256], progress=False,
    )  # fmt: skip
    assert table.lookup(8, 100, epsilon=1.0) == 64


def test_calibration_settings_are_checked_before_anything_is_timed():
    from trtllm_bole.spec.calibration import CalibrationSettings

    with pytest.raises(ValueError, match="epsilon must be a number >= 0"):
        CalibrationSettings(epsilon=float("nan"))
    with pytest.raises(ValueError, match="calibration capacities must be positive integers"):
        CalibrationSettings(capacities=(8, 0))


def roofline_timers():
    """A fake GPU whose verify cost is flat up to a knee that grows with batch (like a roofline)."""

    def time_decode(batch, kv_len):
        return 1e-3 * (1 + kv_len / 4096)

    def time_verify(batch, kv_len, capacity):
        knee = 64 * batch
        return time_decode(batch, kv_len) * max(1.0, capacity / knee)

    return time_verify, time_decode


def test_calibrate_builds_lookup_table(tmp_path):
    time_verify, time_decode = roofline_timers()
    table = calibrate(
        time_verify, time_decode, device="fake", max_depth=8, epsilon=0.0,
        capacities=[8, 64, 128, 256], batch_buckets=[1, 2, 4], kv_buckets=[256, 1024],
    )  # fmt: skip
    assert table.lookup(1, 100) == 64
    assert table.lookup(2, 1000) == 128
    assert table.lookup(3, 1000) == 256  # bucket 4
    assert table.lookup(64, 10**6) == 256  # beyond the range: largest bucket
    # a looser epsilon at serving time, from the stored timings: the b=1 knee is 64, 2x at 128
    assert table.lookup(1, 100, epsilon=1.0) == 128
    path = tmp_path / "budget.json"
    table.save(path)
    assert BudgetTable.load(path).lookup(2, 10) == 128


def test_a_bucket_is_timed_up_to_the_first_capacity_that_holds_its_largest_step():
    caps = (8, 16, 32, 48, 64, 96, 128, 192, 256, 384, 512)
    assert timed_capacities(caps, 1, 64) == [8, 16, 32, 48, 64]
    assert timed_capacities(caps, 2, 64) == [8, 16, 32, 48, 64, 96, 128]
    assert timed_capacities(caps, 2, 40) == [8, 16, 32, 48, 64, 96]  # 80 tokens: 96 covers them
    assert timed_capacities(caps, 16, 64) == timed_capacities(caps, 16, None) == list(caps[1:])
    assert timed_capacities([64, 8, 16], 1, 10) == timed_capacities([8, 16, 64], 1, 10)  # sorted first
    assert timed_capacities(sorted(caps), 1, 10) == [8, 16]


def test_calibration_skips_steps_no_batch_can_take_and_keeps_the_budgets_it_can_use():
    """A step of b requests verifies at most b x per_request tokens: capacities past the first that holds
    them are not timed, and every budget a step can meet (capped at that reach) is the one that timing
    everything gives, at the table's epsilon and at another."""
    time_verify, time_decode = roofline_timers()
    timed = []
    kwargs = dict(device="fake", max_depth=8, epsilon=0.0, capacities=[512, 8, 32, 64, 128, 256],
                  batch_buckets=[1, 2, 4], kv_buckets=[256], progress=False)  # fmt: skip
    full = calibrate(time_verify, time_decode, **kwargs)
    table = calibrate(lambda b, kv, n: timed.append((b, n)) or time_verify(b, kv, n), time_decode,
                      per_request=20, **kwargs)  # fmt: skip
    assert timed == [(1, 8), (1, 32), (2, 8), (2, 32), (2, 64), (4, 8), (4, 32), (4, 64), (4, 128)]
    assert table.capacities == [8, 32, 64, 128, 256, 512]
    for batch in (1, 2, 3, 4):
        for epsilon in (None, 0.0, 0.5, 1.0, 3.0):
            reach = batch * 20
            got, want = table.lookup(batch, 100, epsilon), full.lookup(batch, 100, epsilon)
            assert min(got, reach) == min(want, reach), (batch, epsilon)


def test_another_epsilon_needs_the_timings_to_derive_it():
    """An entry without timings for its capacities serves the table's epsilon and says why not another."""
    from trtllm_bole.spec.budget import BudgetEntry

    table = BudgetTable(0.2, [8], 8, "test", [BudgetEntry(64, 10**6, 8, 1.0, [1.0])])
    assert table.lookup(4, 100) == table.lookup(4, 100, epsilon=0.2) == 8
    with pytest.raises(
        ValueError, match=r"cannot re-derive a budget at epsilon 0\.5.*serve at its own epsilon 0\.2"
    ):
        table.lookup(4, 100, epsilon=0.5)


def test_a_batch_bucket_larger_than_every_capacity_is_refused_before_timing():
    def timed(*args):
        raise AssertionError("timed before the buckets were checked")

    with pytest.raises(ValueError, match=r"batch buckets \[32\] exceed every capacity \[8, 16\]"):
        calibrate(timed, timed, device="cpu", max_depth=9, capacities=(8, 16), batch_buckets=(1, 32),
                  progress=False)  # fmt: skip


def test_load_rejects_a_table_with_a_nan_epsilon(tmp_path):
    path = tmp_path / "budget.json"
    calibrate(*roofline_timers(), device="cpu", max_depth=9, progress=False).save(path)
    path.write_text(path.read_text().replace('"epsilon": 0.2', '"epsilon": NaN'))
    with pytest.raises(ValueError, match=r"budget\.json: not a valid budget table \(epsilon must be"):
        BudgetTable.load(path)


def test_load_rejects_corrupt_tables(tmp_path):
    path = tmp_path / "budget.json"
    path.write_text("{not json")
    with pytest.raises(ValueError, match="not a valid budget table"):
        BudgetTable.load(path)
    path.write_text('{"schema_version": 99}')
    with pytest.raises(ValueError, match="schema version 99"):
        BudgetTable.load(path)


@pytest.mark.parametrize(
    ("entries", "words"),
    [
        ([], "no entries"),
        ([[1, 256, 8], [1, 1024, 8], [2, 256, 8]], r"missing \[\(2, 1024\)\]"),
        ([[1, 256, 8], [1, 256, 16]], "with duplicates"),
        ([[1, 256, 0]], r"budgets must be positive integers, got \[0\]"),
        ([[1, 256, 8.5]], r"budgets must be positive integers, got \[8\.5\]"),
    ],
)
def test_load_refuses_a_table_that_would_fail_a_step(tmp_path, entries, words):
    """A table with a hole in its grid (or no entries, or a budget that is no count of tokens) is refused
    at load; it loaded and failed every step whose sizes fell in the hole."""
    path = tmp_path / "budget.json"
    table = BudgetTable(
        0.2, [8, 16], 9, "cpu", [BudgetEntry(b, kv, n, 1.0, [1.0, 1.0]) for b, kv, n in entries]
    )
    table.save(path)
    with pytest.raises(ValueError, match=words):
        BudgetTable.load(path)


@pytest.mark.parametrize(
    ("edit", "words"),
    [
        (lambda t: t.update(capacities=[16, 8]), r"capacities must be increasing positive integers"),
        (lambda t: t.update(capacities=[8, 8]), r"capacities must be increasing positive integers"),
        (lambda t: t["entries"][0].update(batch_max="1"), r"buckets must be positive integers, got '1'"),
        (lambda t: t["entries"][0].update(kv_max=-256), r"buckets must be positive integers, got 1 x -256"),
        (lambda t: t["entries"][0].update(t_dec_ms=float("nan")), r"timings must be positive finite"),
        (lambda t: t["entries"][0].update(t_ver_ms=[-1.0, 1.0]), r"timings must be positive finite"),
        (lambda t: t["entries"][0].update(t_ver_ms=["1.0", 1.0]), r"timings must be positive finite"),
    ],
)
def test_load_refuses_a_hand_edited_table_it_would_misread(tmp_path, edit, words):
    """String buckets loaded and crashed the first step, NaN or negative timings re-derived the smallest
    budget at any other epsilon, unsorted capacities paired timings with the wrong capacities."""
    path = tmp_path / "budget.json"
    BudgetTable(0.2, [8, 16], 9, "cpu", [BudgetEntry(1, 256, 8, 1.0, [1.0, 1.1])]).save(path)
    table = json.loads(path.read_text())
    edit(table)
    path.write_text(json.dumps(table))
    with pytest.raises(ValueError, match=words):
        BudgetTable.load(path)


@pytest.mark.parametrize("content", ["[]", "null", "3"])
def test_load_names_a_file_that_holds_no_table(tmp_path, content):
    path = tmp_path / "budget.json"
    path.write_text(content)  # an AttributeError traceback
    with pytest.raises(ValueError, match=r"not a valid budget table \(a JSON object was expected"):
        BudgetTable.load(path)
