"""Live views of what runs: a job (``TrainView``: its line once launched,
then the chief's events as a bar on a terminal, as lines otherwise), a
sweep (``SweepView``: a live table of the trials, or a line per start and
end), ``exec``'s lines (``ExecView``) and ``logs``' (``log_printer``).
Where output is not a terminal nothing is redrawn: a log or CI gets plain
lines.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from typing import Any, ClassVar

from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table
from rich.text import Text

from infra.jobs.job import Job
from infra.jobs.progress import describe, metrics_text, number
from infra.jobs.protocol import ProgressEvent, parse_line
from infra.jobs.readiness import Waiting
from infra.jobs.run import JobReporter
from infra.jobs.tf_noise import is_tf_noise
from infra.text import node_text
from tfcluster_cli import consoles
from tfcluster_cli.errors import write_debug_log
from tfcluster_cli.render import cell, params_text


class Null:
    """A view of nothing: where ``up`` shows a spinner on a terminal, this
    elsewhere (a spinner in a log is noise)."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


class TrainView(JobReporter):
    """Renders a job's life: the job's line once launched, then the
    chief's events: a live bar on a terminal, lines otherwise."""

    def __init__(self, quiet: bool, *, echo: bool = False, raw: bool = False) -> None:
        self.quiet = quiet
        # A user's program: every line of the chief's output is shown, and
        # the other tasks' while they start.
        self.echo = echo
        # TensorFlow's load-time log too (infra/jobs/tf_noise.py).
        self.raw = raw
        self.progress: Progress | None = None
        self.task_id: Any = None
        self.start_view = StartView(echo=echo, raw=raw)

    def waiting(self, tasks: list[Waiting]) -> None:
        self.start_view.update(tasks)

    def launched(self, job: Job) -> None:
        consoles.console.print(
            f"job {job.spec.run_id}: {job.spec.label}; "
            + ", ".join(f"{t.name}@{t.node}" for t in job.tasks),
            markup=False,
            soft_wrap=True,
        )

    def following(self) -> TrainView:
        return self

    def __enter__(self) -> TrainView:
        if consoles.console.is_terminal and not self.quiet:
            self.progress = Progress(
                TextColumn("[bold]{task.description}"),
                BarColumn(),
                TextColumn("{task.completed}/{task.total} steps"),
                TextColumn("{task.fields[detail]}", markup=False),
                TimeRemainingColumn(),
                console=consoles.console,
            )
            self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.progress is not None:
            self.progress.stop()

    def event(self, event: ProgressEvent) -> None:
        self._guarded(lambda: self._event(event), lambda: describe(event))

    def _event(self, event: ProgressEvent) -> None:
        if self.progress is None:
            consoles.console.print(describe(event), markup=False)
            return
        if event.kind == "start":
            # Fields are typed (infra/jobs/protocol.py): a count or None.
            self.task_id = self.progress.add_task(
                "training", total=event.get("total_steps") or None, detail=""
            )
            self.progress.console.print(describe(event), markup=False)
        elif event.kind == "progress" and self.task_id is not None:
            detail = f"loss {number(event.get('loss', 0), '.4f')} " + metrics_text(
                event.get("metrics"), ".3f"
            )
            detail += f" {number(event.get('examples_per_sec', 0), '.0f')} ex/s"
            self.progress.update(self.task_id, completed=event.get("step") or 0, detail=detail)
        elif event.kind != "progress":
            self.progress.console.print(describe(event), markup=False)

    def note(self, line: str) -> None:
        """A line of tfcluster's own while the job runs (a recovery)."""

        def show() -> None:
            target = self.progress.console if self.progress else consoles.console
            target.print(line, style="yellow", markup=False, highlight=False, soft_wrap=True)

        self._guarded(show, lambda: line)

    def log(self, line: str) -> None:
        if not self.raw and is_tf_noise(line):
            return
        self._guarded(lambda: self._log(line), lambda: line if self.echo else None)

    def _log(self, line: str) -> None:
        if self.echo:
            target = self.progress.console if self.progress else consoles.console
            target.print(line, markup=False, highlight=False, soft_wrap=True)
            return
        # The trainer's own log lines are in `deploy.py logs`; show errors here.
        if "Error" in line or "error:" in line or "Traceback" in line:
            (self.progress.console if self.progress else consoles.err_console).print(
                f"chief: {line}", style="dim", markup=False, soft_wrap=True
            )

    def _guarded(self, show: Callable[[], None], plain: Callable[[], str | None]) -> None:
        """``show``; should the live view fail (a bug: no line from the
        chief may stop the job), the bar is given up for plain lines,
        once, with the traceback in the debug log, and this line is shown
        plainly."""
        try:
            show()
            return
        except Exception:
            if self.progress is None:
                raise  # plain lines failing is no view's doing
            bar, self.progress, self.task_id = self.progress, None, None
            try:
                where = f"details in {write_debug_log()}"
            except OSError:
                where = "no debug log"
        with contextlib.suppress(Exception):
            bar.stop()
        consoles.err_console.print(
            f"the progress bar failed ({where}); plain lines from here on",
            style="yellow",
            markup=False,
            soft_wrap=True,
        )
        if (text := plain()) is not None:
            consoles.console.print(text, markup=False, highlight=False, soft_wrap=True)


class StartView:
    """While a job's tasks start: a live line per task that does not listen
    yet (its last line of output, the seconds waited) on a terminal, and
    elsewhere a line per task every WAITING_EVERY_S seconds; with ``echo``
    (a user's program) their output as it comes, ``node/task | line``."""

    WAITING_EVERY_S = 30

    def __init__(self, *, echo: bool, raw: bool) -> None:
        self.echo = echo
        self.raw = raw
        self.live: Any = None
        self.tasks: list[Waiting] = []
        self.polled = 0.0  # time.monotonic() of the last poll
        self.last: dict[str, str] = {}  # each task's last line shown so far
        self.said: dict[str, int] = {}  # the WAITING_EVERY_S steps said, per task

    def update(self, tasks: list[Waiting]) -> None:
        import time

        self.tasks, self.polled = tasks, time.monotonic()
        for w in tasks:
            for line in w.new_lines:
                if self.raw or not is_tf_noise(line):
                    self.last[w.task] = line
                    if self.echo:
                        self._print(f"{w.node}/{w.task} | {line}")
        if not consoles.console.is_terminal:
            for w in tasks:
                step = int(w.seconds // self.WAITING_EVERY_S)
                if step > self.said.get(w.task, 0):
                    self.said[w.task] = step
                    self._print(self._line(w, w.seconds))
            return
        if tasks and self.live is None:
            from rich.live import Live

            self.live = Live(self, console=consoles.console, refresh_per_second=2, transient=True)
            self.live.start()
        elif not tasks and self.live is not None:
            self.live.stop()
            self.live = None

    def __rich__(self) -> Text:
        import time

        since = time.monotonic() - self.polled
        return Text("\n".join(self._line(w, w.seconds + since) for w in self.tasks))

    def _line(self, w: Waiting, seconds: float) -> str:
        last = self.last.get(w.task)
        said = f": {last}" if last else ": no output yet"
        where = f"{w.task} on {w.node} to listen on port {w.port}"
        return f"waiting for {where} ({seconds:.0f} s){said}"

    def _print(self, text: str) -> None:
        target = self.live.console if self.live is not None else consoles.console
        target.print(node_text(text), markup=False, highlight=False, soft_wrap=True)


class SweepView:
    """A live table of the trials on a terminal; a line per start and end
    otherwise. Parameter values and metric names are the user's text: every
    cell is Text, never markup."""

    STATE_STYLE: ClassVar[dict[str, str]] = {
        "running": "cyan",
        "done": "green",
        "failed": "red",
        "stopped": "yellow",
    }

    def __init__(self, spec: Any) -> None:
        self.spec = spec
        self.live: Any = None
        self.lock = threading.Lock()
        self.shown: dict[int, str] = {}
        self.trials: dict[int, Any] = {}

    def __enter__(self) -> SweepView:
        if consoles.console.is_terminal:
            from rich.live import Live

            self.live = Live(self.table([]), console=consoles.console, refresh_per_second=4)
            self.live.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.live is not None:
            self.live.stop()

    def ready(self, sweep: Any) -> None:
        """Once the nodes are checked: what is about to run, and where."""
        text = (
            f"sweep {self.spec.sweep_id}: {len(self.spec.points)} trial(s) of "
            f"{node_text(self.spec.label)} on {', '.join(sweep.nodes)}, "
            f"{sweep.per_node} at a time on each"
        )
        (self.live.console if self.live else consoles.console).print(
            text, markup=False, soft_wrap=True
        )

    def change(self, trial: Any) -> None:
        with self.lock:
            self.trials[trial.index] = trial
            if self.live is not None:
                self.live.update(self.table(list(self.trials.values())))
                return
            if self.shown.get(trial.index) == trial.state:
                return  # a new metric: the table at the end has it
            self.shown[trial.index] = trial.state
            line = f"{trial.name} {trial.node or '-'} {params_text(trial.params)} {trial.state}"
            if trial.note:
                line += f" ({trial.note})"
            consoles.console.print(node_text(line), markup=False, highlight=False, soft_wrap=True)

    def table(self, trials: list[Any], *, final: bool = False) -> Table:
        table = Table(title=Text(f"sweep {self.spec.sweep_id}"), title_justify="left")
        last = "seconds" if final else "last metric"
        for column in ("trial", "node", "parameters", "state", last):
            table.add_column(column)
        if final:
            table.add_column("metrics")
        for trial in sorted(trials, key=lambda t: t.index):
            state = trial.state + (f" (exit {trial.exit_code})" if trial.exit_code else "")
            if trial.note and trial.state != "done":
                state += f": {trial.note}"
            shown = trial.metrics if final else trial.last_metric
            metric = metrics_text(dict(list(shown.items())[:3]), ".4g")
            cells = [
                cell(str(trial.index)),
                cell(trial.node or "-"),
                cell(params_text(trial.params)),
                cell(state, self.STATE_STYLE.get(trial.state, "")),
            ]
            if final:
                cells += [cell(f"{trial.seconds:.1f}" if trial.seconds else "-"), cell(metric)]
            else:
                cells.append(cell(metric or "-"))
            table.add_row(*cells)
        return table


class ExecView:
    """``exec``'s output: each line as it comes, after its node's name (one
    line at a time, whichever node's thread prints it). The nodes where the
    command failed are the command's error (``check_exec``), not the view's."""

    def __init__(self, raw: bool = False) -> None:
        self.lock = threading.Lock()
        self.raw = raw  # TensorFlow's load-time log too

    def line(self, node: str, line: str) -> None:
        if not self.raw and is_tf_noise(line):
            return
        with self.lock:
            consoles.console.print(
                f"{node} | {line}", markup=False, highlight=False, soft_wrap=True
            )


def log_printer(raw: bool) -> Callable[[str, str, str], None]:
    """``logs``' line printer: node/task, then the line; unless ``raw``, the
    chief's progress events as sentences and TensorFlow's load-time log
    left out."""

    def show(node: str, task: str, line: str) -> None:
        if not raw and is_tf_noise(line):
            return
        event = None if raw else parse_line(line)
        text = line if event is None else describe(event)
        consoles.console.print(Text.assemble((f"{node}/{task}", "cyan"), " ", text), soft_wrap=True)

    return show
