"""The threads that run a frozen block's parts (xenith_edu/model/cores.py).

Invariants, over generated schedules (callers one after another and, at the same time, one
from another thread; each with a few calls, some of which run parts of their own, with random
waits):
- each caller gets its calls' results, in order, whatever thread it calls from;
- every call of the thread that sets the BLAS's threads (the main one) runs with one BLAS
  thread, and when it is done the BLAS is back to its setting before;
- a call that runs parts of its own (from a thread of the pool) finishes: the pool never waits
  for itself;
- an error in any call reaches its caller, and the setting is restored.
"""

from __future__ import annotations

import threading
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from threadpoolctl import threadpool_limits

from xenith_edu.model import cores

call = st.tuples(st.floats(0, 0.003), st.integers(0, 3))  # (wait, calls of its own)
calls = st.lists(call, min_size=1, max_size=4)


def _run(spec: tuple[float, int], tag: tuple) -> tuple:
    wait, inner = spec
    time.sleep(wait)
    threads = cores.blas_threads()
    got = cores.on_threads([lambda i=i: (tag, i, cores.blas_threads())
                            for i in range(inner)]) if inner else []
    return tag, threads, got


def _check(results: list, specs: list, j: int, one_thread: bool) -> None:
    assert len(results) == len(specs)
    for i, ((tag, threads_in, got), (_, inner)) in enumerate(zip(results, specs, strict=True)):
        assert tag == (j, i)
        assert [(g[0], g[1]) for g in got] == [((j, i), k) for k in range(inner)]
        if one_thread:
            assert threads_in == 1 and all(g[2] == 1 for g in got)


@settings(max_examples=40, deadline=None)
@given(main=st.lists(calls, min_size=1, max_size=3), other=st.none() | calls,
       setting=st.integers(2, 3))
def test_calls_get_their_results_in_order_with_one_blas_thread_and_the_setting_back(
        main, other, setting):
    kept = cores._state.get("pool")
    cores._state["pool"] = None  # a pool of just the workers the first caller needs
    errors: list[BaseException] = []

    def run() -> None:
        try:
            _schedule(main, other, setting)
        except BaseException as e:  # noqa: BLE001 (re-raised below, in the test's thread)
            errors.append(e)

    try:  # in a thread of its own, so that a pool waiting for itself fails, not hangs
        t = threading.Thread(target=run, daemon=True)
        t.start()
        t.join(timeout=20)
        assert not t.is_alive(), "the calls never finished: the pool waited for itself"
        if errors:
            raise errors[0]
    finally:
        cores._state["pool"] = kept


def _schedule(main: list, other: list | None, setting: int) -> None:
    with threadpool_limits(setting):
        side: dict[str, list] = {}
        if other is not None:  # a caller in another thread at the same time
            t = threading.Thread(target=lambda: side.setdefault("r", cores.on_threads(
                [lambda s=s, i=i: _run(s, (9, i)) for i, s in enumerate(other)])))
            t.start()
        for j, specs in enumerate(main):
            got = cores.on_threads([lambda s=s, i=i, j=j: _run(s, (j, i))
                                    for i, s in enumerate(specs)])
            _check(got, specs, j, one_thread=True)
            assert cores.blas_threads() == setting
        if other is not None:
            t.join(timeout=10)
            assert not t.is_alive(), "a caller never finished"
            _check(side["r"], other, 9, one_thread=False)
        assert cores.blas_threads() == setting


def test_an_error_in_a_call_reaches_the_caller_and_the_setting_is_restored():
    with threadpool_limits(2):
        def boom() -> None:
            raise ValueError("a part failed")

        for order in ([lambda: 1, boom], [boom, lambda: 1]):
            with pytest.raises(ValueError, match="a part failed"):
                cores.on_threads(order)
            assert cores.blas_threads() == 2
