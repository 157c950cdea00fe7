"""`idle._search`, a binary search in each rank code's run of keys, gives what one sort of the keys
and queries together gave: ties on either side, NaN values (sorted last), codes without keys,
queries in any order of their codes."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from diag.metrics import idle

NAN = float("nan")


def _sorted_together(kc: np.ndarray, kv: np.ndarray, qc: np.ndarray, qv: np.ndarray, side: str) -> np.ndarray:
    """The search as it was made before (keys and queries sorted together, ties by `side`)."""
    n = len(kc)
    kind = np.append(np.full(n, side == "left"), np.full(len(qc), side != "left"))
    order = np.lexsort((kind, np.append(kv, qv), np.append(kc, qc)))
    key = order < n
    out = np.empty(len(qc), np.int64)
    out[order[~key] - n] = np.cumsum(key)[~key]
    return out


_VALUE = st.one_of(st.integers(0, 6).map(float), st.just(NAN))


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 4), _VALUE), max_size=25),
    st.lists(st.tuples(st.integers(0, 5), _VALUE), max_size=15),
    st.sampled_from(["left", "right"]),
)
def test_search_in_each_codes_keys_is_the_joint_sorts(keys, queries, side):
    keys = sorted(
        keys, key=lambda kv: (kv[0], np.inf if kv[1] != kv[1] else kv[1])
    )  # by code, value (NaN last)
    kc = np.array([k for k, _ in keys], dtype=np.int64)
    kv = np.array([v for _, v in keys], dtype=float)
    qc = np.array([k for k, _ in queries], dtype=np.int64)
    qv = np.array([v for _, v in queries], dtype=float)
    np.testing.assert_array_equal(idle._search(kc, kv, qc, qv, side), _sorted_together(kc, kv, qc, qv, side))
