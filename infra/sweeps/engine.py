"""The engine of a sweep: its trials started, followed, fetched and
recorded on nodes made ready for it.

A sweep is a grid of parameter values (``--param NAME=V1,V2``), each point
one *trial*: a single process on one node (no TF_CONFIG cluster), started
by the very commands a job's task gets (``infra/node/commands.py``), with
``TFCLUSTER_TRIAL``, ``TFCLUSTER_RUN_DIR`` and one environment variable per
parameter (``LEARNING_RATE=0.001``). Each node runs up to ``per_node``
trials at a time; the next trial starts as soon as a slot is free. A trial
that fails is recorded and the others go on; a trial whose node is lost is
queued again once, on another node. Every trial's run folder comes home into
one sweep folder, beside ``sweep.json`` (what ran where, how it ended, its
final metrics), which ``deploy.py report`` reads.

This module is the engine that runs the trials on a transport; getting a
cluster's nodes ready for it is infra/sweeps/run.py, the grid and each
point's command infra/sweeps/spec.py, a trial's record and its metrics
infra/sweeps/trial.py. It parses nothing from the command line and prints
nothing: the CLI renders the ``Trial`` records it is called back with.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

from infra.errors import (
    HostKeyChanged,
    Interrupted,
    JobFailed,
    RemoteError,
    StateError,
)
from infra.node import commands, facts, task_env
from infra.sweeps.spec import SweepSpec, param_env
from infra.sweeps.trial import SWEEP_FILE, Trial, line_metrics, read_json, summary_metrics, utc_now
from infra.text import node_text
from infra.transport.base import Transport

if TYPE_CHECKING:
    pass

log = logging.getLogger("tfcluster")

# Tries of one trial: its first start, and one more after its node was lost.
MAX_ATTEMPTS = 2


# -- the engine ------------------------------------------------------------------


class Sweep:
    """Runs the trials of ``spec`` on ``nodes`` through ``transport``,
    ``per_node`` at a time on each, bringing each trial's run folder to
    ``dest/trial-N``. ``on_change(trial)`` is called (from any thread) when
    a trial starts, ends or reports a metric."""

    def __init__(
        self,
        transport: Transport,
        nodes: Sequence[str],
        spec: SweepSpec,
        *,
        per_node: int,
        dest: Path,
        env: Mapping[str, str] | None = None,
        workdir: Path | None = None,
        on_change: Callable[[Trial], None] = lambda t: None,
        bucket: str | None = None,
        on_started: Callable[[str, Trial], None] = lambda node, t: None,
    ) -> None:
        """``bucket``: the sweep's gs:// folder (each trial's is below it,
        TFCLUSTER_BUCKET_URL); ``on_started(node, trial)`` once a trial
        runs (the cluster starts its uploader there)."""
        self.transport = transport
        self.bucket = bucket
        self.on_started = on_started
        self.nodes = list(nodes)
        self.spec = spec
        self.per_node = per_node
        self.dest = dest
        self.env = dict(env or {})
        self.workdir = workdir
        self.on_change = on_change
        self.trials = [Trial(i, dict(p)) for i, p in enumerate(spec.points)]
        self.lost: list[str] = []
        self.started = utc_now()
        self.ended: str | None = None
        self._events: queue.Queue[tuple[Trial, int | None, str]] = queue.Queue()
        self._write_lock = threading.Lock()
        self._fetches: list[Future[None]] = []
        self._env_files: dict[str, str | None] = {}

    # -- paths and commands --

    def run_dir(self, node: str, trial: Trial) -> str:
        return f"{self.transport.layout(node).runs}/{self.spec.sweep_id}/{trial.name}"

    def _env_file(self, node: str) -> str | None:
        """The file of the user's values on ``node`` (infra/node/task_env.py),
        written before the node's first trial, removed at the sweep's end."""
        with self._write_lock:
            if node in self._env_files:
                return self._env_files[node]
        private = {**dict(self.spec.env), **self.env}
        written = task_env.put(self.transport, node, self.spec.sweep_id, private)
        with self._write_lock:
            self._env_files[node] = written
        return written

    def _start_script(self, node: str, trial: Trial) -> str:
        layout = self.transport.layout(node)
        own = {
            **param_env(trial.params),
            "TFCLUSTER_RUN_ID": self.spec.sweep_id,
            "TFCLUSTER_SWEEP": self.spec.sweep_id,
            "TFCLUSTER_TRIAL": str(trial.index),
            **({"TFCLUSTER_BUCKET_URL": f"{self.bucket}/{trial.name}"} if self.bucket else {}),
        }
        env_file = self._env_file(node)
        env = task_env.split({**dict(self.spec.env), **self.env}, own)
        cwd = None
        if not self.spec.builtin:
            if self.workdir is None:
                raise StateError("a sweep of a command runs in a working folder; none was given")
            cwd = self.transport.workdir(node, self.workdir)
        return commands.start_task(
            layout,
            trial.name,
            self.spec.command(trial.params),
            env,
            cwd=cwd,
            run_dir=self.run_dir(node, trial),
            path_env={"PYTHONPATH": layout.code} if self.spec.builtin else {},
            env_file=env_file,
        )

    # -- the schedule --

    def run(self) -> list[Trial]:
        """Run every trial; the trials as they ended. Ctrl-C stops every
        running trial (and raises ``Interrupted``)."""
        self.dest.mkdir(parents=True, exist_ok=True)
        queued = list(self.trials)
        running: dict[str, list[Trial]] = {n: [] for n in self.nodes}
        self.write()
        try:
            with ThreadPoolExecutor(max_workers=4) as fetcher:
                while queued or any(running.values()):
                    self._fill(queued, running)
                    if not any(running.values()):
                        break  # every node lost: what is queued cannot run
                    try:
                        trial, code, why = self._events.get(timeout=0.5)
                    except queue.Empty:
                        continue
                    running[trial.node or ""].remove(trial)
                    self._ended(trial, code, why, queued, running, fetcher)
                for trial in queued:
                    self._finish(trial, "failed", None, "no node left to run it on")
                for future in self._fetches:
                    future.result()
        except KeyboardInterrupt:
            self._stop_all(running)
            raise Interrupted(
                f"interrupted: every running trial was stopped; what had finished is in {self.dest}"
            ) from None
        except BaseException:
            self._stop_all(running)
            raise
        finally:
            written = [n for n, f in self._env_files.items() if f]
            if written:
                task_env.forget(self.transport, written, self.spec.sweep_id)
        self.ended = utc_now()
        self.write()
        return self.trials

    def _fill(self, queued: list[Trial], running: dict[str, list[Trial]]) -> None:
        """Start queued trials on the free slots, the least busy node first;
        a batch all at once (over SSH a start is a round trip or more, and
        the trials must not wait for each other's)."""
        while True:
            batch: list[tuple[str, Trial]] = []
            while queued:
                free = [
                    n for n in self.nodes if n not in self.lost and len(running[n]) < self.per_node
                ]
                if not free:
                    break
                node = min(free, key=lambda n: (len(running[n]), self.nodes.index(n)))
                trial = queued.pop(0)
                # Counted as running before it starts: a Ctrl-C while the
                # start command is on its way must stop it too.
                running[node].append(trial)
                batch.append((node, trial))
            if not batch:
                return
            with ThreadPoolExecutor(max_workers=min(16, len(batch))) as pool:
                started = list(pool.map(lambda job: self._start(*job), batch))
            again = []
            for (node, trial), ok in zip(batch, started, strict=True):
                if not ok:
                    running[node].remove(trial)
                    if trial.state == "queued":  # its node was lost before it started
                        again.append(trial)
            if not again:
                return
            queued[:0] = again

    def _start(self, node: str, trial: Trial) -> bool:
        trial.node, trial.attempts = node, trial.attempts + 1
        try:
            result = self.transport.run(node, self._start_script(node, trial), timeout=60)
        except HostKeyChanged:
            raise
        except RemoteError as exc:
            self._lose(node, trial, str(exc))
            return False
        if not result.ok or trial.name not in facts.parse_started(result.stdout):
            self._finish(trial, "failed", None, f"could not start: {node_text(result.tail())}")
            return False
        trial.state, trial.started, trial._t0 = "running", utc_now(), time.monotonic()
        trial.ended = trial.seconds = None
        trial.note = ""
        self.on_change(trial)
        self.write()
        self.on_started(node, trial)
        threading.Thread(target=self._follow, args=(node, trial), daemon=True).start()
        return True

    def _follow(self, node: str, trial: Trial) -> None:
        """Follow the trial's log to its end (in its own thread): its metrics
        as they come, then its exit code."""
        code: int | None = None
        why = ""

        def on_line(line: str) -> None:
            nonlocal code
            if facts.is_exit_marker(line):
                code = facts.parse_exit_marker(line)
                return
            metrics = line_metrics(line)
            if metrics:
                trial.last_metric = metrics
                self.on_change(trial)

        try:
            self.transport.stream(
                node, commands.follow_log(self.transport.layout(node), trial.name), on_line
            )
        except RemoteError as exc:
            why = str(exc)
        except BaseException as exc:  # a bug: the main thread must still hear of it
            why = f"{type(exc).__name__}: {exc}"
        self._events.put((trial, code, why))

    def _ended(
        self,
        trial: Trial,
        code: int | None,
        why: str,
        queued: list[Trial],
        running: dict[str, list[Trial]],
        fetcher: ThreadPoolExecutor,
    ) -> None:
        node = trial.node or ""
        # No exit code: killed, or its node lost (preempted, deleted); a
        # trial that wrote its code ended as it did, whatever came after.
        if code is None and (node in self.lost or not self._reachable(node)):
            self._lose(node, trial, why or "it no longer answers")
            if trial.state == "queued":
                queued.insert(0, trial)
            return
        if code is None:
            # Its follow ended without the exit code, the node answering:
            # the trial may well still run (a follow cut short); stopped, so
            # that a trial recorded as ended is not left running there.
            self._stop_on(node, [trial.name])
        state = "done" if code == 0 else "failed"
        note = "" if code is not None else "ended without an exit code (killed?)"
        self._finish(trial, state, code, note)
        self._fetches.append(fetcher.submit(self._fetch, node, trial))

    def _reachable(self, node: str) -> bool:
        try:
            self.transport.run(node, "true", timeout=30)
        except HostKeyChanged:
            raise
        except RemoteError:
            return False
        return True

    def _lose(self, node: str, trial: Trial, why: str) -> None:
        """``node`` is gone: no more trials there; ``trial`` (which ran on
        it) is queued again, unless this was its last try."""
        if node not in self.lost:
            self.lost.append(node)
            log.warning("node %s lost mid-sweep: %s", node, node_text(why))
        trial.lost_nodes.append(node)
        if trial.attempts >= MAX_ATTEMPTS:
            self._finish(trial, "failed", None, f"its node was lost {trial.attempts} times")
            return
        trial.state, trial.note = "queued", f"{node} lost; queued again"
        self.on_change(trial)

    def _finish(self, trial: Trial, state: str, code: int | None, note: str) -> None:
        trial.state, trial.exit_code, trial.ended = state, code, utc_now()
        if trial._t0:
            trial.seconds = round(time.monotonic() - trial._t0, 3)
        if note:
            trial.note = note
        if not trial.metrics and trial.last_metric:
            trial.metrics = dict(trial.last_metric)
        self.on_change(trial)
        self.write()

    def _fetch(self, node: str, trial: Trial) -> None:
        """The trial's run folder, home; its summary.json's metrics."""
        folder = self.dest / trial.name
        try:
            self.transport.fetch(node, self.run_dir(node, trial), folder)
        except HostKeyChanged:
            raise
        except RemoteError as exc:
            log.warning("could not fetch %s from %s: %s", trial.name, node, exc)
            return
        summary = read_json(folder / "summary.json")
        if isinstance(summary, dict):
            metrics = summary_metrics(summary)
            if metrics:
                trial.metrics = metrics
                self.on_change(trial)
        self.write()

    def _stop_all(self, running: Mapping[str, list[Trial]]) -> None:
        """Stop every running trial, on all nodes at once."""
        by_node = {
            n: [t.name for t in ts] for n, ts in running.items() if ts and n not in self.lost
        }

        with ThreadPoolExecutor(max_workers=min(16, len(by_node)) or 1) as pool:
            list(pool.map(lambda node: self._stop_on(node, by_node[node]), by_node))
        for trials in running.values():
            for trial in trials:
                self._finish(trial, "stopped", None, "stopped by Ctrl-C")
        for trial in self.trials:
            if trial.state == "queued":
                trial.state, trial.note = "stopped", "never started (Ctrl-C)"
                self.on_change(trial)  # a table of the trials lists it too
        self.ended = utc_now()
        self.write()

    def _stop_on(self, node: str, names: list[str]) -> None:
        try:
            self.transport.run(
                node, commands.stop_tasks(self.transport.layout(node), names), timeout=60
            )
        except RemoteError as exc:
            log.warning("could not stop the trials on %s: %s", node, exc)

    def check(self) -> None:
        """Raise JobFailed (exit 1) unless every trial succeeded, naming
        those that did not."""
        failed = [t for t in self.trials if t.state != "done"]
        if failed:
            raise JobFailed(
                f"{len(failed)} of {len(self.trials)} trial(s) failed: "
                + ", ".join(f"{t.name} ({_how_it_ended(t)})" for t in failed),
                exit_code=1,
                hint="`deploy.py logs` shows each trial's log (trial-N)",
            )

    # -- sweep.json --

    def as_dict(self) -> dict[str, Any]:
        return {
            "sweep_id": self.spec.sweep_id,
            "command": list(self.spec.argv),
            "builtin": self.spec.builtin,
            "label": self.spec.label,
            "params": {k: list(v) for k, v in self.spec.params.items()},
            "per_node": self.per_node,
            "nodes": self.nodes,
            "lost_nodes": self.lost,
            "started": self.started,
            "ended": self.ended,
            "trials": [t.as_dict() for t in self.trials],
        }

    def write(self) -> None:
        """sweep.json, atomically (a report read meanwhile sees a whole one)."""
        with self._write_lock:
            text = json.dumps(self.as_dict(), indent=2)
            fd, tmp = tempfile.mkstemp(prefix=".sweep-", suffix=".json", dir=self.dest)
            try:
                with os.fdopen(fd, "w") as out:
                    out.write(text)
                os.replace(tmp, self.dest / SWEEP_FILE)
            except BaseException:
                Path(tmp).unlink(missing_ok=True)
                raise


def _how_it_ended(trial: Trial) -> str:
    return f"exit {trial.exit_code}" if trial.exit_code is not None else trial.note
