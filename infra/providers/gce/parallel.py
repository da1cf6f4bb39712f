"""One batch of API work on many items at once, and its cancellation.

Everything that touches several nodes runs them in parallel threads: four
nodes take about as long as one. The threads are daemons and stop making
calls once the main thread is interrupted (each checks the batch's cancel
event before every call and every pause), so a Ctrl-C returns at once.

At once, but not before the calls that change something (create, delete,
start, stop) already on the wire are answered: an insert sent in the
moment of the Ctrl-C would otherwise land after ``up`` returned, perhaps
after the ``down`` the user ran next had listed the nodes, and leave a VM
running that no command knew of. Reads (operation waits among them, which
can take two minutes) are left behind.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections.abc import Callable, Hashable, Iterator, Sequence
from typing import Any, TypeVar, cast

from infra.providers.gce.errors import _Cancelled

log = logging.getLogger("tfcluster")

# The client's HTTP session pools 10 connections per client: more threads
# than that would open and throw away extra connections.
_MAX_PARALLEL = 10

_T = TypeVar("_T", bound=Hashable)
_R = TypeVar("_R")

# Worker threads of one ``parallel`` batch share its cancel event.
_tls = threading.local()


def _current_cancel() -> threading.Event | None:
    return cast("threading.Event | None", getattr(_tls, "cancel", None))


def _check_cancelled() -> None:
    event = _current_cancel()
    if event is not None and event.is_set():
        raise _Cancelled


# Mutating calls under way in this process (see the module's docstring).
_mutations = threading.Condition()
_mutations_in_flight = 0


@contextlib.contextmanager
def _mutation() -> Iterator[None]:
    """Around one call that changes something: counted while it runs, and
    refused (_Cancelled) once the batch is cancelled. The check and the count
    are one step under the lock, so a cancelling thread that then waits for
    the count to reach zero cannot miss a call about to be sent."""
    global _mutations_in_flight
    with _mutations:
        _check_cancelled()
        _mutations_in_flight += 1
    try:
        yield
    finally:
        with _mutations:
            _mutations_in_flight -= 1
            _mutations.notify_all()


def _settle(timeout: float) -> None:
    """Until no mutating call is on the wire (at most ``timeout`` seconds).
    Said, since it may take a while; a second Ctrl-C leaves at once (timed
    waits: a SIGINT that the kernel hands to a worker thread only sets a
    flag the main thread checks when it runs again)."""
    deadline = time.monotonic() + timeout
    with _mutations:
        if _mutations_in_flight:
            log.warning(
                "interrupted: waiting for %d API call(s) already sent to be answered "
                "(Ctrl-C again to leave now)",
                _mutations_in_flight,
            )
        while _mutations_in_flight and (left := deadline - time.monotonic()) > 0:
            _mutations.wait(min(0.2, left))


def _pause(seconds: float) -> None:
    """Sleep, but end at once (with _Cancelled) when the batch is cancelled."""
    event = _current_cancel()
    if event is None:
        time.sleep(seconds)
    elif event.wait(seconds):
        raise _Cancelled


def parallel(
    fn: Callable[[_T], _R], items: Sequence[_T], *, settle_s: float = 70.0
) -> tuple[dict[_T, _R], dict[_T, BaseException]]:
    """``fn`` on every item at once; (results, errors) by item.

    Daemon threads: an interrupted main thread returns at once and the
    process can exit; the batch's cancel event stops the workers from
    making further calls (each checks it before every call and sleep).
    An interrupt returns once the mutating calls already sent are answered
    (at most ``settle_s``, a little over one call's timeout)."""
    results: dict[_T, _R] = {}
    errors: dict[_T, BaseException] = {}
    if not items:
        return results, errors
    cancel = _current_cancel() or threading.Event()
    done: queue.Queue[tuple[_T, bool, Any]] = queue.Queue()
    slots = threading.Semaphore(_MAX_PARALLEL)

    def run(item: _T) -> None:
        _tls.cancel = cancel
        with slots:
            try:
                _check_cancelled()
                done.put((item, True, fn(item)))
            except BaseException as exc:  # handed to the caller, whatever it is
                done.put((item, False, exc))

    try:
        # Starting the threads is inside the try: an interrupt that lands
        # while the later ones start must still cancel the earlier ones.
        for item in items:
            threading.Thread(target=run, args=(item,), daemon=True, name=f"gce-{item}").start()
        for _ in items:
            while True:
                # A timed wait: a SIGINT the kernel hands to another thread
                # only sets Python's flag, which the main thread checks when
                # it runs again; an untimed wait would sleep on until a
                # worker finishes.
                try:
                    item, ok, value = done.get(timeout=0.2)
                    break
                except queue.Empty:
                    continue
            if ok:
                results[item] = value
            else:
                errors[item] = value
    except BaseException:
        cancel.set()
        _settle(settle_s)
        raise
    return results, errors
