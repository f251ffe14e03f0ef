"""The ring all-reduce exercise's statement and reference agree on every size, K dividing the
buffer or not: a ring written here, padding included, sends what the reference says.

The statement (the "Many processes" chapter): a buffer that K does not divide is padded with
zeros to the next multiple of K, so that the chunks are equal, and the padding is sent too.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import xenith_edu.exercises as ex
from xenith_edu.exercises.parallel import ring_bytes_reference

# Shape legend: n numbers in a buffer, K ranks; chunks[r][c] is rank r's copy of chunk c.


def ring(bufs: list[np.ndarray]) -> tuple[list[np.ndarray], list[int]]:
    """Every rank's sum, and the numbers each rank sent: reduce-scatter then all-gather, each
    rank sending one chunk to its right neighbour per step, the buffer padded to K chunks."""
    K, n = len(bufs), bufs[0].size
    pad = -n % K
    chunks = [np.split(np.concatenate((b, np.zeros(pad))), K) for b in bufs]
    sent = [0] * K
    for offset, add in ((0, True), (1, False)):
        for step in range(K - 1):
            msgs = [(r, (r + offset - step) % K) for r in range(K)]
            data = [chunks[r][c].copy() for r, c in msgs]  # on the wire, all at once
            for (r, c), d in zip(msgs, data, strict=True):
                right = (r + 1) % K
                chunks[right][c] = chunks[right][c] + d if add else d
                sent[r] += d.size
    return [np.concatenate(c)[:n] for c in chunks], sent


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 200), K=st.integers(1, 9), itemsize=st.sampled_from([1, 2, 4, 8]))
def test_the_reference_is_what_a_padded_ring_sends(n: int, K: int, itemsize: int) -> None:
    rng = np.random.default_rng(n * 10 + K)
    bufs = [rng.standard_normal(n) for _ in range(K)]
    out, sent = ring(bufs)
    total = np.sum(bufs, axis=0)
    assert all(np.allclose(o, total, rtol=1e-12, atol=1e-12) for o in out)
    assert len(set(sent)) == 1  # equal chunks: every rank sends the same
    assert ring_bytes_reference(n, itemsize, K) == (sent[0] * itemsize,)


def test_the_cases_reach_sizes_that_k_does_not_divide() -> None:
    spec = ex.SPECS["ring_allreduce_bytes"]
    for seed in [None, 1, 2, 3]:
        cases = spec.make_cases(None if seed is None else np.random.default_rng(seed))
        rests = {c.args[0] % c.args[2] for c in cases}
        assert 0 in rests and 1 in rests and len(rests) >= 3


@pytest.mark.parametrize("seed", [None, 5, 6])
def test_chunks_rounded_down_are_named(seed) -> None:
    spec = ex.SPECS["ring_allreduce_bytes"]
    rng = None if seed is None else np.random.default_rng(seed)
    for wrong, words in ((lambda n, i, K: 2 * (K - 1) * (n // K) * i, "rounded down"),
                         (lambda n, i, K: 2 * (K - 1) * n * i // K, "exact share")):
        result = ex.check(spec, wrong, rng)
        assert not result.passed and result.status == "failed", result.message
        assert words in result.message and "ceil(n_params / K)" in result.message, result.message
