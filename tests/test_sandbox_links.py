"""The sandbox runs the grader's Python however it is reached: the interpreter's path may be a
chain of links through folders that are none of the ones the sandbox binds (a virtual
environment made from a linked interpreter, a tools folder of links, relative or absolute).
Generated chains; each is checked by the sandbox's own probe, which runs the interpreter inside.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_grading import need_bwrap

from xenith_edu.grader.sandbox import link_hops

ROOT = Path(__file__).resolve().parent.parent
PROBE = ("import sys; sys.path[:0] = {paths!r}; "
         "from xenith_edu.grader.sandbox import check_works; check_works(); print('ok')")


def chain(base: Path, relative: list[bool]) -> Path:
    """Links base/hop0/python -> base/hop1/python -> ... -> the real interpreter, each hop in
    a folder of its own, written relative or absolute as `relative` says."""
    target = Path(os.path.realpath(sys.executable))
    for i, rel in reversed(list(enumerate(relative))):
        link = base / f"hop{i}" / "python"
        link.parent.mkdir(parents=True)
        link.symlink_to(os.path.relpath(target, link.parent) if rel else target)
        target = link
    return target


def test_the_hops_of_a_chain_are_named_in_order(tmp_path):
    head = chain(tmp_path, [True, False, True])
    hops = link_hops(str(head))
    assert hops == [str(tmp_path / f"hop{i}" / "python") for i in range(3)]
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    assert link_hops(str(loop)) == [str(loop)]  # a loop ends the walk


@settings(max_examples=4, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(relative=st.lists(st.booleans(), min_size=1, max_size=3))
def test_an_interpreter_reached_through_any_chain_of_links_runs_in_the_sandbox(tmp_path_factory,
                                                                                relative):
    need_bwrap()
    head = chain(tmp_path_factory.mktemp("links"), relative)
    paths = [str(ROOT)] + [p for p in sys.path if p.endswith("site-packages")]
    run = subprocess.run([str(head), "-c", PROBE.format(paths=paths)], capture_output=True,
                         text=True, timeout=120)
    assert run.returncode == 0 and run.stdout.strip() == "ok", run.stderr[-500:]


def test_a_virtual_environment_of_a_linked_interpreter_runs_in_the_sandbox(tmp_path):
    need_bwrap()
    linked = chain(tmp_path / "tools", [False])
    subprocess.run([str(linked), "-m", "venv", "--without-pip", str(tmp_path / "venv")],
                   check=True, capture_output=True, timeout=120)
    python = tmp_path / "venv" / "bin" / "python"
    assert os.path.realpath(os.readlink(python.parent / "python3")) != str(linked)
    paths = [str(ROOT)] + [p for p in sys.path if p.endswith("site-packages")]
    run = subprocess.run([str(python), "-c", PROBE.format(paths=paths)], capture_output=True,
                         text=True, timeout=120)
    assert run.returncode == 0 and run.stdout.strip() == "ok", run.stderr[-500:]
