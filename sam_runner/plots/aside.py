"""Figures drawn in other processes while a report goes on (``sam-report``).

Drawing is most of a large report's CPU (matplotlib's layout, ticks and text: over a thousand
jobs, ``measures.png`` alone is a second and a half), and each figure is drawn from its
arguments alone (``plots.cache.save_plot``: it reads no file). So ``sam-report`` starts a
drawing server before it reads the jobs: a process forked then, which imports matplotlib while
the report reads. Each figure is then sent to it (pickled: the drawing function by name and its
arguments); it forks a worker per figure, up to as many at once as the report may use cores,
and the workers write their files (atomically, as in-process) and send back what the cache
records of them. The report goes on with its tables meanwhile.

A figure that cannot be pickled, or whose worker fails, is drawn in the report's own process,
where an error is raised as it would be without the server. Without ``os.fork`` or with one
core there is no server, and every figure is drawn in-process, in order.
"""

from __future__ import annotations

import json
import os
import pickle
import select
import struct
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

MAX_WORKERS = 8  # a report has a dozen figures at most; more workers only add forks
FRAME = struct.Struct("<QQ")  # a request's number and its pickle's length


def usable_cores() -> int:
    """The cores this process may run on (its affinity, where the system says)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


class DrawnAside:
    """A drawing server: ``submit(fn, args, done)`` runs ``fn(*args)`` in a worker process and
    ``done(its result)`` here, by ``finish()`` at the latest.

    Args:
        workers: how many workers may draw at once; fewer than 2 starts no server (a worker
            would only share the one core with the report): every call runs here.
    """

    def __init__(self, workers: int | None = None) -> None:
        self.workers = min(MAX_WORKERS, usable_cores() if workers is None else workers)
        self._server: tuple[int, int, int] | None = None  # (pid, requests, results)
        self._waiting: dict[int, tuple[Callable, tuple, Callable]] = {}
        self._results = b""
        if self.workers >= 2 and hasattr(os, "fork"):
            self._start()

    def _start(self) -> None:
        requests, results = os.pipe(), os.pipe()
        _flush()
        pid = os.fork()
        if pid == 0:  # the server: serve until the report closes its requests, then leave
            code = 1
            try:
                os.close(requests[1])
                os.close(results[0])
                _serve(requests[0], results[1], self.workers)
                code = 0
            finally:
                os._exit(code)
        os.close(requests[0])
        os.close(results[1])
        self._server = (pid, requests[1], results[0])

    def submit(self, fn: Callable[..., Any], args: tuple, done: Callable[[Any], None]) -> None:
        """``fn(*args)`` by a worker, its result (JSON data) given to ``done`` here; here and
        now where there is no server or the call cannot be pickled.

        Args:
            fn: a module-level function (sent by name); it writes a file and returns JSON data.
            args: its arguments (pickled).
            done: takes ``fn``'s result, in this process.
        """
        data = None
        if self._server is not None:
            try:
                data = pickle.dumps((fn, args), protocol=pickle.HIGHEST_PROTOCOL)
            except Exception:  # noqa: BLE001 - a lambda, an open file: drawn here instead
                data = None
        if data is None:
            done(fn(*args))
            return
        number = len(self._waiting) + 1
        while number in self._waiting:
            number += 1
        self._waiting[number] = (fn, args, done)
        _write_all(self._server[1], FRAME.pack(number, len(data)) + data)
        self._take_results(self._server[2], block=False)  # the results pipe never fills

    def _take_results(self, results: int, block: bool) -> None:
        """Take the results the server has sent on ``results`` (all of them when ``block``:
        until it leaves)."""
        while block or select.select([results], [], [], 0)[0]:
            chunk = os.read(results, 1 << 16)
            if not chunk:
                return
            self._results += chunk
            *lines, self._results = self._results.split(b"\n")
            for line in lines:
                self._settle(json.loads(line))

    def _settle(self, result: dict) -> None:
        fn, args, done = self._waiting.pop(result["id"])
        # a failed worker's figure is drawn here, where its error is raised
        done(result["value"] if result["ok"] else fn(*args))

    def finish(self) -> None:
        """Every call done: the server told there are no more, its results taken, the calls it
        did not answer run here."""
        if self._server is None:
            return
        pid, requests, results = self._server
        self._server = None
        os.close(requests)
        try:
            self._take_results(results, block=True)
        finally:
            os.close(results)
            os.waitpid(pid, 0)
        for number in list(self._waiting):  # the server failed before answering
            self._settle({"id": number, "ok": False})

    def abandon(self) -> None:
        """After an error here: the server told there are no more and waited for (its workers
        finish; each file they write is whole or absent), the results unused."""
        if self._server is None:
            return
        pid, requests, results = self._server
        self._server, self._waiting = None, {}
        os.close(requests)
        while os.read(results, 1 << 16):
            pass
        os.close(results)
        os.waitpid(pid, 0)


def _flush() -> None:
    sys.stdout.flush()
    sys.stderr.flush()


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _serve(requests: int, results: int, workers: int) -> None:
    """The server's loop: read requests, run each in a worker forked for it (at most
    ``workers`` at once), send each result as one JSON line."""
    import matplotlib.backends.backend_agg  # noqa: F401 - once here, not once per worker
    import matplotlib.figure  # noqa: F401
    import matplotlib.font_manager  # noqa: F401

    buffer, queue, running, reading = b"", [], {}, True
    while reading or queue or running:
        while queue and len(running) < workers:
            number, call = queue.pop(0)
            running.update(_fork_worker(number, call))
        ready, _, _ = select.select(([requests] if reading else []) + list(running), [], [])
        for fd in ready:
            if fd != requests:
                _send(results, *_collect(fd, *running.pop(fd)))
                continue
            chunk = os.read(requests, 1 << 16)
            reading = bool(chunk)
            buffer += chunk
            while len(buffer) >= FRAME.size:
                number, size = FRAME.unpack_from(buffer)
                if len(buffer) < FRAME.size + size:
                    break
                queue.append((number, buffer[FRAME.size : FRAME.size + size]))
                buffer = buffer[FRAME.size + size :]


def _fork_worker(number: int, call: bytes) -> dict[int, tuple[int, int]]:
    """A worker forked to run one pickled call; {its pipe: (its pid, the request's number)}."""
    read, write = os.pipe()
    _flush()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.close(read)
            fn, args = pickle.loads(call)
            data = json.dumps(fn(*args)).encode()
            _write_all(write, data)
            code = 0
        finally:
            os._exit(code)
    os.close(write)
    return {read: (pid, number)}


def _collect(read: int, pid: int, number: int) -> tuple[int, bool, Any]:
    """A worker's (request number, success, result), once it has left."""
    chunks = []
    while chunk := os.read(read, 1 << 16):
        chunks.append(chunk)
    os.close(read)
    ok = os.waitpid(pid, 0)[1] == 0 and bool(chunks)
    return number, ok, json.loads(b"".join(chunks)) if ok else None


def _send(results: int, number: int, ok: bool, value: Any) -> None:
    _write_all(results, json.dumps({"id": number, "ok": ok, "value": value}).encode() + b"\n")
