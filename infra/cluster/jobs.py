"""The job side of ``Cluster``: the spec of a job (the built-in trainer or
the user's program), its launch (on nodes made ready by ``ready_nodes``,
infra/cluster/ready.py: start every task, remember it), its end (watch,
cancel, the exit code recorded); finding it again later is
infra/cluster/ready.py's (``running_job``, ``attach``), ``fetch``
infra/cluster/runs.py's.

A mixin of ``Cluster`` (infra/cluster/api.py): callers call ``cluster.launch()``;
infra/jobs/run.py is a job's whole life as one call on top of these.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from infra.cluster.base import locked
from infra.cluster.ready import ClusterReady, ReadyNodes
from infra.config.loader import check_env
from infra.errors import (
    ConfigError,
    HostKeyChanged,
    Interrupted,
    JobFailed,
    StateError,
)
from infra.jobs.destination import check_destination
from infra.jobs.job import Job, shielded
from infra.jobs.keras_choice import LEGACY_ENV, legacy_keras
from infra.jobs.progress import ProgressEvent, StartupClock
from infra.jobs.readiness import Waiting
from infra.spec.job import (
    CANCELLED,
    JobRecord,
    JobSpec,
    Program,
    new_run_id,
    program_name,
    trainer_program,
)
from infra.spec.tfconfig import TaskSpec, build_tasks
from infra.text import node_text
from trainer import catalog

log = logging.getLogger("tfcluster")


class ClusterJobs(ClusterReady):
    # -- jobs --------------------------------------------------------------------

    def train_spec(self, *, resume: bool = False, **overrides: Any) -> JobSpec:
        """The built-in trainer: cluster.yaml's job with command-line
        overrides (None = keep)."""
        job = self.config.job
        values: dict[str, Any] = {
            "model": job.model,
            "mode": job.mode,
            "steps": job.steps,
            "batch_size": job.batch_size,
            "checkpoint_every": job.checkpoint_every,
            "learning_rate": job.learning_rate,
            "data_dir": job.data_dir,
            "extra_args": tuple(job.args),
        }
        values.update({k: v for k, v in overrides.items() if v is not None})
        values["data_dir"] = self.node_path(values["data_dir"])
        # The trainer's --epochs (after --) instead of a number of steps: the
        # trainer takes one or the other, so job.steps is not passed then.
        if any(a == "--epochs" or a.startswith("--epochs=") for a in values["extra_args"]):
            if overrides.get("steps") is not None:
                raise ConfigError("--steps and the trainer flag --epochs: give one of them")
            values["steps"] = None
        mode = catalog.mode(values["mode"])
        self._check_roles(mode)
        notes = self._mode_notes(mode, values)
        if resume:
            run_id = self._resumed_run_id(values["model"], values["mode"])
        else:
            run_id = new_run_id(f"{values['model']}-{values['mode']}")
        program = trainer_program(resume=resume, **values)
        return JobSpec(
            run_id=run_id,
            program=program,
            model=values["model"],
            mode=values["mode"],
            resume=resume,
            notes=tuple(notes),
        )

    def _check_roles(self, mode: catalog.Mode) -> None:
        """A ConfigError where cluster.yaml's roles lack what ``mode`` needs."""
        roles = self.config.roles
        if mode.needs_ps and not roles.ps:
            raise ConfigError(
                f"{self.config.source}: roles: {mode.name} mode needs a ps node; "
                "add roles.ps, or train with --mode sync (job.mode: sync)"
            )
        if mode.needs_workers and not roles.worker:
            raise ConfigError(
                f"{self.config.source}: roles: {mode.name} mode needs worker nodes; "
                "add roles.worker, or train with --mode single"
            )

    def _resumed_run_id(self, model: str, mode: str) -> str:
        """The run id of the last job (here, else in the bucket), which a
        --resume continues: it must have trained this model in this mode."""
        last = self.last_job() or self.last_bucket_run()
        if last is None:
            raise StateError(
                "nothing to resume: no earlier job of this cluster is known; "
                "run `deploy.py train` first"
            )
        if (last.model, last.mode) != (model, mode):
            if last.model is None:
                raise StateError(
                    f"the last job ({last.run_id}) was a program of yours, not a training "
                    "of the built-in trainer; nothing to resume"
                )
            raise StateError(
                f"the last job trained {last.model} in {last.mode} mode; resume it with "
                f"--model {last.model} --mode {last.mode}"
            )
        return last.run_id

    def _mode_notes(self, mode: catalog.Mode, values: Mapping[str, Any]) -> list[str]:
        """The mode's own checks of the job (its catalog entry's
        ``check_job``), before any task starts: lines to show, or a
        ConfigError for what the trainer would refuse."""
        roles = self.config.roles
        try:
            return catalog.check_job(
                mode.name,
                values["model"],
                values["extra_args"],
                batch_size=values["batch_size"],
                workers=roles.worker,
                ps=roles.ps,
            )
        except ValueError as exc:
            raise ConfigError(f"--mode {mode.name}: {exc}") from None

    def run_spec(
        self,
        argv: Sequence[str],
        *,
        ps: bool = True,
        env: Mapping[str, str] | None = None,
        workdir: Path | None = None,
    ) -> JobSpec:
        """The user's own program: ``argv`` as one process per task (ps,
        workers and the chief of cluster.yaml's roles; no ps with
        ``ps=False``), in the working folder. Where ``workdir`` is given
        and the program's main file there is written for ``tf.keras`` as
        TensorFlow's tutorials write one, it gets Keras 2 as ``tf.keras``
        (infra/jobs/keras_choice.py), and the spec's notes say so."""
        if not argv:
            raise ConfigError("no command to run: put it after --, e.g. -- python train.py")
        variables = {**self.config.job.env, **(env or {})}
        for name, value in variables.items():
            if (problem := check_env(name, value)) is not None:
                raise ConfigError(f"--env: {problem}")
        notes: tuple[str, ...] = ()
        legacy = legacy_keras(argv, workdir, variables) if workdir is not None else None
        if legacy is not None:
            variables[LEGACY_ENV] = "1"
            notes = (
                f"tf.keras is Keras 2 (tf-keras) for this job: {legacy.name} uses tf.keras and "
                f"imports no keras of its own; --env {LEGACY_ENV}=0 gives it Keras 3",
            )
        roles = self.config.roles
        task_types = ["chief"]
        if roles.worker:
            task_types.append("worker")
        if ps and roles.ps:
            task_types.append("ps")
        program = Program(
            argv=tuple(argv), task_types=tuple(task_types), env=tuple(sorted(variables.items()))
        )
        return JobSpec(run_id=new_run_id(program_name(argv)), program=program, notes=notes)

    def job_nodes(self, task_types: Sequence[str]) -> list[str]:
        """The nodes that run a task of these types, in cluster.yaml's order."""
        wanted = {n for role in task_types for n in self.config.nodes_of(role)}
        return [n for n in self.config.nodes if n in wanted]

    def job_tasks(self, task_types: Sequence[str], names: Sequence[str]) -> list[TaskSpec]:
        """The job's tasks on ``names`` (its nodes), each at its node's
        internal address: the tasks reach each other on the cluster's
        private network, never through the external IPs."""
        listed = {node.name: node.internal_ip for node in self.provider.non_terminated_nodes()}
        addresses = {n: listed.get(n) or "" for n in names}
        # Not a problem of cluster.yaml: the provider reports no address (a
        # VM still getting one). An empty one would reach TF_CONFIG as ":2222".
        if missing := [n for n in names if not addresses[n]]:
            raise StateError(
                f"no internal address known for {', '.join(map(node_text, missing))}",
                hint="the provider reports none yet: try again in a moment; "
                "`deploy.py status` shows the nodes",
            )
        roles = {role: self.config.nodes_of(role) for role in ("ps", "worker", "chief")}
        try:
            return build_tasks(task_types, roles, addresses, self.provider.task_port)
        except ValueError as exc:
            raise ConfigError(f"{self.config.source}: roles: {exc}") from None

    def workdir(self, override: Path | None = None) -> Path:
        """The working folder (``--workdir``, else job.workdir); must exist."""
        folder = (override or self.config.workdir()).expanduser().resolve()
        if not folder.is_dir():
            # A flag is named as typed; cluster.yaml's key after its file,
            # as every other problem of the file.
            key = "--workdir" if override else f"{self.config.source}: job.workdir"
            raise ConfigError(f"{key}: {folder} is not a folder; give an existing folder")
        return folder

    # -- a job's launch ------------------------------------------------------------

    def launch(
        self,
        spec: JobSpec,
        *,
        workdir: Path | None = None,
        on_event: Callable[[ProgressEvent], None] = lambda e: None,
        on_log: Callable[[str], None] = lambda line: None,
        on_waiting: Callable[[list[Waiting]], None] = lambda waiting: None,
        sync: bool = True,
    ) -> Job:
        """Refuse if a job is running (leaving it alone), sync the code (and
        the working folder of a user's program), start every task and
        remember the job. ``Job.watch`` then follows it to its end."""
        on_event = shielded(on_event)
        clock = StartupClock(on_event, self.started)
        program = spec.program
        if program.in_workdir and workdir is None:
            workdir = self.workdir()
        synced = workdir if program.in_workdir else None
        with self.ready_nodes(
            "train" if program.builtin else "run",
            self.job_nodes(program.task_types),
            workdir=synced,
            sync=sync,
        ) as ready:
            if ready.synced:
                from infra.setup import code_snapshot

                # What a recovery will restart it with (infra/setup/code_snapshot.py).
                code_snapshot.record(ready.transport, self.config, spec.run_id, synced)
                clock.mark("sync")
            elif (
                not ready.transport.copies_files
                and synced
                and (synced / "requirements.txt").is_file()
            ):
                log.warning(
                    "the local cluster runs this machine's Python; install requirements.txt "
                    "into it yourself"
                )
            job = self._start_job(
                spec, ready, workdir=workdir, on_event=on_event, on_log=on_log,
                on_waiting=on_waiting, clock=clock,
            )  # fmt: skip
            self.remember(job)
            # The chief's node mirrors its run folder into the bucket.
            self.start_uploader(
                ready.transport, job.chief.node, run_id=spec.run_id, run_dir=job.output_dir,
                watch_task=job.chief.name, label=spec.label, command=program.argv,
                model=spec.model, mode=spec.mode,
            )  # fmt: skip
        return job

    def _start_job(
        self,
        spec: JobSpec,
        ready: ReadyNodes,
        *,
        workdir: Path | None,
        on_event: Callable[[ProgressEvent], None],
        on_log: Callable[[str], None],
        on_waiting: Callable[[list[Waiting]], None],
        clock: StartupClock,
    ) -> Job:
        """Every task of the job on the ready nodes, the chief last."""
        transport = ready.transport
        tasks = self.job_tasks(spec.program.task_types, ready.names)
        self.provider.before_tasks(spec.program, tasks)
        spec = self.bucket_spec(spec, transport, tasks)
        job = Job(
            transport,
            tasks,
            spec,
            env={**self.provider.task_env(), **self.bucket_env(spec.run_id)},
            workdir=workdir,
            on_event=on_event,
            on_log=on_log,
            on_waiting=on_waiting,
            clock=clock,
            busy=functools.partial(self.keep_busy, transport),
        )
        try:
            job.start()
        except (JobFailed, Interrupted) as exc:
            # A job that failed at start is the last job all the same:
            # `status` names it with its code, `logs` shows why.
            self.remember(job, exit_code=exc.exit_code)
            raise
        return job

    def watch(self, job: Job, dest: Path) -> int:
        """Follow a launched job to its end and bring its run folder to
        ``dest``; the chief's exit code (recorded, also when the fetch at
        the end fails: the job itself ended as the chief did)."""
        try:
            return job.watch(dest)
        finally:
            self.remember(job, exit_code=job.exit_code if job.exit_code is not None else -1)

    def cancel(self) -> tuple[JobRecord, list[str]]:
        """Stop every task of the running (or last) job on purpose. The job
        is marked cancelled first, without the lock: a recovery holds the
        lock for minutes while it starts a node again (no task runs then),
        and looks for the mark after each of its waits; it then ends there."""
        record = self.last_job()
        if record is not None:
            self._mark_cancelled(record.run_id)
            holder = self._lock.holder()
            if holder is not None and holder.command == "recover":
                log.warning(
                    "%s is being recovered (%s); it stops at its next step, not restarted",
                    record.run_id,
                    holder.describe(),
                )
                return record, []
        return self._cancel()

    def _mark_cancelled(self, run_id: str) -> None:
        def put(data: dict[str, Any]) -> None:
            last = data.get("last_job")
            if isinstance(last, dict) and last.get("run_id") == run_id:
                last["cancelled"] = True

        self.state.modify(put)

    @locked("cancel")
    def _cancel(self) -> tuple[JobRecord, list[str]]:
        record = self.last_job()
        if record is None:
            raise StateError("no job to cancel: none of this cluster is known")
        job = self.attach(record, require=False)
        chief = None
        # The chief's state is only a hint for the code recorded below; with a
        # changed host key, stop() stops the other nodes' tasks first and
        # then raises that very error.
        if job is not None:
            with contextlib.suppress(HostKeyChanged):
                chief = job.status().get(job.chief.name)
        stopped = job.stop() if job is not None else []
        if record.exit_code is None:
            # A chief that had ended by itself (a --detach job) keeps its own
            # code; and a code its watcher wrote meanwhile is kept too.
            code = CANCELLED
            if chief is not None and not chief.alive and chief.exit_code is not None:
                code = chief.exit_code
            record.exit_code = code
            self._record_end(record.run_id, code)
        return record, stopped

    def remember(self, job: Job, exit_code: int | None = None) -> None:
        record = job.record()
        record.exit_code = exit_code

        def put(data: dict[str, Any]) -> None:
            last = data.get("last_job")
            # A job's end is written without the cluster lock (see lock()):
            # by then a newer job may be the last one, and it stays so.
            if exit_code is None or not last or last.get("run_id") == record.run_id:
                # A cancel asked for meanwhile stays asked for (a recovery
                # reads it); a launch is a new start.
                record.cancelled = exit_code is not None and bool(last and last.get("cancelled"))
                data["last_job"] = record.__dict__

        self.state.modify(put)

    def local_run_dir(self, run_id: str, dest: Path | None = None) -> Path:
        """Where ``run_id``'s folder comes home: in ``dest``, else in
        runs/<cluster>/. One that cannot be written, given or the default,
        is refused here (ConfigError), which every caller asks before it
        starts anything."""
        if dest is not None:
            check_destination(dest / run_id, dest)
            return dest / run_id
        folder = Path("runs") / self.config.name / run_id
        check_destination(
            folder,
            folder,
            key="the results folder",
            hint="--dest FOLDER brings the results elsewhere",
        )
        return folder
