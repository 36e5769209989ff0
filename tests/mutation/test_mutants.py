"""The mutants stay current (no mutation run needed): each edit's text is found once, ids are unique, and
every test path a mutant names exists. A stale entry used to surface only in a full run (about an hour).
A selection that runs no test (a renamed test, a ``-k`` that matches none) is reported stale by the run,
never killed."""

import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))

from mutants import MUTANTS  # noqa: E402


def test_mutant_ids_are_unique():
    ids = [m.id for m in MUTANTS]
    assert sorted({i for i in ids if ids.count(i) > 1}) == []


def test_a_selection_that_ran_no_test_is_not_a_kill():
    from run import outcome

    assert outcome(1, None) == "killed" and outcome(2, None) == "killed"  # a failure; a broken import
    assert outcome(4, None).startswith("stale") and outcome(5, None).startswith("stale")
    assert outcome(0, None) == "survived" and outcome(0, "same result") == "equivalent"


@pytest.mark.parametrize("mutant", MUTANTS, ids=lambda m: m.id)
def test_each_mutant_applies_once_and_names_tests_that_exist(mutant):
    assert (ROOT / mutant.file).read_text().count(mutant.old) == 1, f"{mutant.id} is stale: update or drop it"
    assert mutant.old != mutant.new
    paths = [t.split("::")[0] for t in mutant.tests if not t.startswith("-") and "/" in t]
    assert paths and all((ROOT / path).exists() for path in paths), paths
