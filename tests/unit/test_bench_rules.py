"""The labeled evaluation (bench/rules.py) as a test: on every labeled sample trace and reproduction,
no rule labeled must-not fires, every must-flag rule fires (known misses excepted, with their reason
in the labels), and every fix of every finding is applicable as written."""

from __future__ import annotations

import os

import pytest
import tomllib
from diag.analyzers import registered_rules

from bench import rules as bench

FOLDERS = bench.labeled()
RULES = sorted(registered_rules())


def test_there_are_healthy_and_planted_samples():
    kinds = set()
    for f in FOLDERS:
        with open(os.path.join(f, bench.LABELS), "rb") as fh:
            kinds.add(bool(tomllib.load(fh)["must_flag"]))
    assert kinds == {True, False} and len(FOLDERS) >= 15


@pytest.mark.parametrize("folder", FOLDERS, ids=[os.path.basename(f) for f in FOLDERS])
def test_labels_hold(folder):
    s = bench.score(folder, RULES)
    assert not s.false_alarms, f"false alarm: {s.false_alarms}"
    assert not (s.misses - set(s.excused)), f"missed: {s.misses}"
    assert s.bad_fixes == []
    assert s.wrong_severity == {}, "severity follows the share of time at stake (labels' [severity])"


def test_scores_count_false_alarms_and_misses():
    """The scoring can fail: a rule that fired where it must not is a false alarm, a silent must-flag
    a miss, and both lower precision / recall."""
    hit = bench.Scored("a", {"straggler", "exposed_comm"}, {"straggler"}, {"exposed_comm"}, {})
    miss = bench.Scored("b", set(), {"straggler"}, set(), {})
    rows = {r[0]: r for r in bench.table([hit, miss], ["straggler", "exposed_comm"])}
    assert rows["straggler"][1:] == (1, 0, 1, 1.0, 0.5)
    assert rows["exposed_comm"][1:] == (0, 1, 0, 0.0, None)


def test_a_wrong_severity_is_reported():
    s = bench.Scored("a", {"exposed_comm"}, {"exposed_comm"}, set(), {}, [], {"exposed_comm": "warning"})
    s.expected_severity = {"exposed_comm": "critical"}
    assert s.wrong_severity == {"exposed_comm": ("critical", "warning")}
    s.severities["exposed_comm"] = "critical"
    assert s.wrong_severity == {}
