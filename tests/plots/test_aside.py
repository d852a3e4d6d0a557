"""The drawing server (plots/aside.py): calls run in worker processes, at most ``workers`` at
once, their results handed back here; a call that cannot be pickled or whose worker fails runs
here (its error raised here); after an error the server is waited for, none left behind."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from results.results_helpers import living_children

from sam_runner.plots.aside import DrawnAside


def _pid_of(folder: Path, name: str, pause: float = 0.0) -> int:
    """Writes when it ran into ``folder/name``; this process's pid."""
    start = time.monotonic()
    time.sleep(pause)
    (folder / name).write_text(f"{start} {time.monotonic()}")
    return os.getpid()


def _fails_unless_in(pid: int) -> int:
    if os.getpid() != pid:
        raise RuntimeError("a worker's failure")
    return pid


def _always_fails() -> None:
    raise ValueError("a figure's own error")


def test_calls_run_in_workers_at_most_two_at_once_their_results_handed_back(tmp_path):
    before = living_children()
    aside = DrawnAside(workers=2)
    assert len(living_children() - before) == 1  # the server, started at once
    got = {}
    for i in range(4):
        aside.submit(_pid_of, (tmp_path, f"call{i}", 0.3), lambda pid, i=i: got.__setitem__(i, pid))
    aside.finish()
    assert sorted(got) == [0, 1, 2, 3]
    assert os.getpid() not in got.values() and len(set(got.values())) == 4  # a worker each
    spans = [tuple(map(float, (tmp_path / f"call{i}").read_text().split())) for i in range(4)]
    at_once = max(sum(a <= t < b for a, b in spans) for t, _ in spans)
    assert at_once <= 2
    assert living_children() == before  # the server and its workers gone


def test_a_failed_worker_is_run_here_and_an_error_is_raised_here():
    aside = DrawnAside(workers=2)
    got = []
    aside.submit(_fails_unless_in, (os.getpid(),), got.append)
    aside.finish()
    assert got == [os.getpid()]  # failed in its worker, then run here
    aside = DrawnAside(workers=2)
    aside.submit(_always_fails, (), got.append)
    with pytest.raises(ValueError, match="a figure's own error"):
        aside.finish()


def test_no_server_with_one_worker_and_a_call_that_cannot_be_pickled_runs_here(tmp_path):
    before = living_children()
    aside = DrawnAside(workers=1)
    assert living_children() == before
    got = []
    aside.submit(_pid_of, (tmp_path, "one"), got.append)
    assert got == [os.getpid()]  # at once, here
    aside = DrawnAside(workers=2)
    aside.submit(lambda: os.getpid(), (), got.append)  # noqa: PLW0108 - a lambda: no pickle
    assert got[-1] == os.getpid()
    aside.finish()


def test_after_an_error_the_server_is_waited_for_and_nothing_is_left(tmp_path):
    before = living_children()
    aside = DrawnAside(workers=2)
    got = []
    aside.submit(_pid_of, (tmp_path, "late", 0.2), got.append)
    aside.abandon()
    assert living_children() == before and got == []  # its result unused
    assert (tmp_path / "late").is_file()  # the call it had was finished, not cut
    aside.abandon()  # again: nothing to do
    aside.finish()
