"""`make mutants`: does the suite catch a bug planted at a decision point?

Each mutation below is one small, plausible bug: (file, an exact snippet of
the code, what replaces it, the tests that claim that behaviour). The script
copies the tree to a temporary folder once (the working tree is never
touched), and for each mutation writes the mutated file there, runs only its
tests with ``pytest -x`` and puts the file back. A mutation the tests fail
on is *caught*; one they pass on *survived* (a gap in the suite, or a
mutation that changes nothing: either way, worth a look). A snippet that is
no longer in the code is an error, so the list cannot silently drift away
from the code it is about.

    python scripts/mutants.py                # every mutation; exit 1 below 90 %
    python scripts/mutants.py -k firewall    # those whose name contains "firewall"
    python scripts/mutants.py --list         # names and files only

Slow (a few minutes): not part of `make test`.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
THRESHOLD = 0.90
TIMEOUT_S = 600  # per mutation: a hang the tests' own timeouts did not end counts as caught
# The unmutated tree's run is every mutation's tests at once: many times one
# mutation's (a busy machine took over 600 s for it).
BASELINE_TIMEOUT_S = 3600
IGNORE = shutil.ignore_patterns(
    ".git", ".venv", "__pycache__", ".mypy_cache", ".ruff_cache", ".pytest_cache", "runs",
    ".cache", "*.pyc",
)


@dataclass(frozen=True)
class Mutant:
    name: str
    file: str
    old: str
    new: str
    tests: tuple[str, ...]  # pytest paths or node ids
    select: str = ""  # a pytest -k expression within them ("" = all)


def m(name: str, file: str, old: str, new: str, *tests: str, k: str = "") -> Mutant:
    return Mutant(name, file, old, new, tests, k)


GCE_INSTANCES = "infra/providers/gce/instances.py"
GCE_ERRORS = "infra/providers/gce/errors.py"
GCE_FIREWALL = "infra/providers/gce/firewall.py"
T_GCE = "tests/test_gce_provider.py"
T_ANSWERS = "tests/test_gce_answers.py"
SCHEMA = "infra/config/schema.py"
GCE_CONFIG = "infra/providers/gce/config.py"
T_DRIFT = "tests/test_firewall_drift.py"
T_CONFIG = ("tests/test_config.py", "tests/test_config_inputs.py", "tests/test_config_sections.py")
T_CMD = "tests/test_commands.py"
K_ZONES = "zone or stockout or quota or deleted_by_hand"
K_FW = "firewall or drift or denied or ssh_open or prepare"
K_RETRY = "transient or keeps_failing or retry"

MUTANTS: list[Mutant] = [
    # -- config strictness ------------------------------------------------------------------
    m("config: unknown keys ignored everywhere", "infra/config/base.py",
      'extra="forbid", frozen=True, strict=True',
      'extra="ignore", frozen=True, strict=True', *T_CONFIG),
    m("config: lax types (steps: '10' is 10)", "infra/config/base.py",
      'extra="forbid", frozen=True, strict=True',
      'extra="forbid", frozen=True, strict=False', *T_CONFIG),
    *[
        m(f"config: {section} accepts unknown keys", file,
          f'class {cls}(Strict):\n',
          f'class {cls}(Strict):\n    model_config = {{"extra": "ignore", "frozen": True}}\n',
          *T_CONFIG)
        for section, cls, file in [
            ("job", "JobConfig", SCHEMA), ("setup", "SetupConfig", SCHEMA),
            ("ssh", "SshConfig", SCHEMA), ("ports", "Ports", SCHEMA), ("roles", "Roles", SCHEMA),
            ("gce", "GceConfig", GCE_CONFIG), ("gce.accelerator", "Accelerator", GCE_CONFIG),
            ("hosts.<node>", "HostConfig", "infra/config/hosts.py"),
        ]
    ],
    m("config: privileged ports allowed", "infra/config/base.py",
      "Port = Annotated[int, Field(ge=1024, le=65535)]",
      "Port = Annotated[int, Field(ge=1, le=65535)]", *T_CONFIG),
    # -- TF_CONFIG --------------------------------------------------------------------------
    m("tfconfig: tasks get the nodes' external addresses", "infra/cluster/jobs.py",
      "listed = {node.name: node.internal_ip for node in self.provider.non_terminated_nodes()}",
      "listed = {node.name: node.external_ip for node in self.provider.non_terminated_nodes()}",
      "tests/test_job_addresses.py"),
    m("tfconfig: chief started first", "infra/spec/tfconfig.py",
      'for task_type in ("ps", "worker", "chief"):',
      'for task_type in ("chief", "ps", "worker"):', "tests/test_tfconfig.py"),
    m("tfconfig: two tasks on one address allowed", "infra/spec/tfconfig.py",
      "if other is not None:", "if other is None and False:", "tests/test_tfconfig.py"),
    m("tfconfig: cluster lists out of index order", "infra/spec/tfconfig.py",
      "key=lambda t: (ROLE_ORDER.index(t.type), t.index)",
      "key=lambda t: (ROLE_ORDER.index(t.type), -t.index)", "tests/test_tfconfig.py"),
    m("tfconfig: every task is index 0", "infra/spec/tfconfig.py",
      '"task": {"type": task.type, "index": task.index}',
      '"task": {"type": task.type, "index": 0}', "tests/test_tfconfig.py"),
    m("tfconfig: two chiefs accepted", "infra/spec/tfconfig.py",
      'if task_type == "chief" and len(nodes) != 1:',
      'if task_type == "chief" and len(nodes) < 1:', "tests/test_tfconfig.py"),
    # -- zone choice and failover (gce) ----------------------------------------------------------
    m("zones: the cluster's own zone not preferred", GCE_INSTANCES,
      "key=lambda z: (-counts.get(z, 0), zones.index(z))",
      "key=lambda z: (0, zones.index(z))", T_GCE, k=K_ZONES),
    m("failover: a stockout is not a reason to move on", GCE_INSTANCES,
      "unusable = {n: e for n, e in errors.items() if isinstance(e, _ZoneUnusable)}",
      "unusable: dict[str, BaseException] = {}", T_GCE, k=K_ZONES),
    m("failover: what the failed zone created is left behind", GCE_INSTANCES,
      "            self._delete_in_zone(zone, names)\n",
      "            pass\n", T_GCE, k=K_ZONES),
    m("failover: quota is not a zone problem", GCE_ERRORS,
      'return "quotaExceeded" in _reasons(exc) or "Quota \'" in _api_message(exc)',
      "return False", T_GCE, k=K_ZONES),
    m("failover: a GPU the zone lacks (400 'was not found') stops `up`", GCE_INSTANCES,
      "            if not_in_zone(message, zone):\n", "            if False:\n", T_ANSWERS),
    m("failover: a stockout answered as HTTP 503 retried in the same zone", GCE_ERRORS,
      "            if is_stockout(message):\n", "            if False:\n", T_ANSWERS),
    m("stop: a node with Local SSD stopped without discardLocalSsd", GCE_INSTANCES,
      "(not keep) if local_ssd else None", "None", T_ANSWERS),
    m("retry: transient API errors not retried", GCE_ERRORS,
      "        if code in _RETRY_STATUS:\n",
      "        if False:\n", T_GCE, k=K_RETRY),
    # -- firewall bodies and drift -----------------------------------------------------------
    m("firewall: drift in source_ranges not repaired", GCE_FIREWALL,
      "            sorted(rule.source_ranges),\n", "", T_DRIFT, T_GCE, k=K_FW),
    m("firewall: drift in priority not repaired", GCE_FIREWALL,
      "            rule.priority,\n", "", T_DRIFT, T_GCE, k=K_FW),
    m("firewall: drift in target_tags not repaired", GCE_FIREWALL,
      "            sorted(rule.target_tags),\n", "", T_DRIFT, T_GCE, k=K_FW),
    m("firewall: gRPC open to every address", GCE_FIREWALL,
      "                source_tags=[self.network_tag],\n",
      '                source_ranges=["0.0.0.0/0"],\n', T_GCE, k=K_FW),
    m("firewall: SSH open to the world whatever the config", GCE_FIREWALL,
      "source_ranges=list(self.gce.ssh_source_ranges),",
      'source_ranges=["0.0.0.0/0"],', T_GCE, k=K_FW),
    m("firewall: deny rule as strong as the allow", GCE_FIREWALL,
      "priority=DENY_PRIORITY,\n                denied=[",
      "priority=1000,\n                denied=[", T_GCE, k=K_FW),
    m("firewall: SSH deny rule as strong as the allow", GCE_FIREWALL,
      "priority=DENY_PRIORITY,\n            denied=[", "priority=1000,\n            denied=[",
      T_GCE, "tests/test_gce_strict.py", k=K_FW + " or ssh"),
    m("firewall: no warning for SSH open to all", GCE_FIREWALL,
      'return any(r in ("0.0.0.0/0", "::/0") for r in self.gce.ssh_source_ranges)',
      "return False", T_GCE, k=K_FW),
    # -- sync decisions -----------------------------------------------------------------------
    m("sync: stale files never deleted on the node", "infra/setup/sync.py",
      "stale = sorted(p for p in comparison.present - set(manifest) if _managed(p, items))",
      "stale: list[str] = []",
      "tests/test_sync_decision.py", "tests/test_workdir_sync_kinds.py"),
    m("sync: ignored files on the node deleted too", "infra/setup/sync.py",
      "            return item.keeps(remote)\n", "            return True\n",
      "tests/test_sync_decision.py", "tests/test_workdir_sync_kinds.py"),
    m("sync: files outside every item deleted", "infra/setup/sync.py",
      "            return item.keeps(remote)\n    return False\n",
      "            return item.keeps(remote)\n    return True\n",
      "tests/test_sync_decision.py", "tests/test_workdir_sync_kinds.py"),
    m("sync: unchanged files sent again", "infra/setup/sync.py",
      "send = sorted(p for p in comparison.changed if p in manifest)",
      "send = sorted(manifest)",
      "tests/test_sync_decision.py", "tests/test_workdir_sync_kinds.py"),
    m("sync: emptied folders removed shallowest first", "infra/setup/sync.py",
      'key=lambda d: (-d.count("/"), d)', 'key=lambda d: (d.count("/"), d)',
      "tests/test_workdir_sync_kinds.py"),
    m("sync: rsync without --delete", "infra/setup/commands.py",
      'args = ["-a", "-z", "--delete", ', 'args = ["-a", "-z", ',
      "tests/test_sync_decision.py", "tests/test_setup_parsers.py"),
    m("setup: the venv made by python3 whatever setup.python says", "infra/setup/commands.py",
      "py = shlex.quote(plan.python)", 'py = "python3"',
      "tests/test_setup_python.py", "tests/test_setup_parsers.py"),
    # -- task liveness ---------------------------------------------------------------------
    m("liveness: a reused pid is the task (plain kill -0)", "infra/node/commands.py",
      '[ "$(start_tick "$p")" = "$t" ] && \'\n        \'is_task "$p" "$n" && echo "$p"; }',
      'kill -0 "$p" 2>/dev/null && \'\n        \'echo "$p"; }', T_CMD),
    m("liveness: start time not checked", "infra/node/commands.py",
      '[ "$(start_tick "$p")" = "$t" ] && ', "", T_CMD),
    m("liveness: any process with the pid is the task", "infra/node/commands.py",
      'is_task "$p" "$n" && echo "$p"; }', 'echo "$p"; }',
      T_CMD, "tests/test_run_attack.py"),
    m("liveness: a second start on a running task allowed", "infra/node/commands.py",
      "echo 'already running {task}' >&2; exit 3", "echo 'already running {task}' >&2",
      T_CMD),
    m("liveness: readiness waits out a dead task", "infra/node/commands.py",
      "if [ $pending = 0 ] || [ $died = 1 ] || ", "if [ $pending = 0 ] || ", T_CMD),
    # -- a task's watch (infra/node/watchdog.py) and autostop's busy ------------------------------
    m("watchdog: a process at the chief's pid is the chief", "infra/node/watchdog.py",
      'tfc_stat "$p" && [ "$tfc_tick" = "$t" ]; then miss=0', 'tfc_stat "$p"; then miss=0',
      "tests/test_watchdog.py"),
    m("watchdog: a chief never seen is taken for gone", "infra/node/watchdog.py",
      "elif [ $armed = 1 ]; then tfc_gone", "else tfc_gone", "tests/test_watchdog.py"),
    m("watchdog: the ps and workers of a job get no watch", "infra/jobs/job.py",
      "watch=None if task is self.chief else", "watch=None if True else",
      "tests/test_run_local.py", k="detached_jobs_tasks"),
    m("autostop: busy marks not counted", "infra/node/autostop_commands.py",
      'then b=$((b+1)); else rm -f "$f"; fi', 'then :; else rm -f "$f"; fi',
      "tests/test_autostop.py", k="busy"),
    m("env: the user's values on the command line", "infra/node/task_env.py",
      "    public = {k: v for k, v in DEFAULTS.items() if k not in private}\n",
      "    public = {**DEFAULTS, **private}\n",
      "tests/test_task_env.py", k="command_line"),
    m("liveness: task status parsed alive when dead", "infra/node/facts.py",
      'alive=alive == "1"', "alive=True", T_CMD),
    m("trainer: BFC allocator not chosen", "trainer/__main__.py",
      "    use_pooling_cpu_allocator()\n", "", "tests/test_trainer_environment.py"),
    m("trainer: the user's allocator choice overridden", "trainer/__main__.py",
      'os.environ.setdefault("TF_CPU_ALLOCATOR_USE_BFC", "true")',
      'os.environ["TF_CPU_ALLOCATOR_USE_BFC"] = "true"', "tests/test_trainer_environment.py"),
    # -- resume step ----------------------------------------------------------------------
    m("resume: input stream restarts at batch 0", "trainer/data/inputs.py",
      "tf.data.Dataset.range(start_batch, sys.maxsize)", "tf.data.Dataset.range(0, sys.maxsize)",
      "tests/trainer/test_units.py::test_index_stream_is_a_permutation_per_epoch_and_resumable"),
    # -- the chief's start-up ----------------------------------------------------------------
    m("startup: matplotlib kept out for good", "trainer/imports.py",
      "            if name in sys.modules and sys.modules[name] is None:\n"
      "                del sys.modules[name]\n",
      "            pass\n",
      "tests/trainer/test_units.py", k="matplotlib or kept_out"),
    m("startup: matplotlib imported with TensorFlow again", "trainer/imports.py",
      "    blocked = [name for name in names if name not in sys.modules]",
      "    blocked: list[str] = []",
      "tests/trainer/test_units.py", k="matplotlib"),
    # -- where results come home ---------------------------------------------------------------
    m("dest: an unwritable --dest found only after the job", "infra/cluster/jobs.py",
      "            check_destination(dest / run_id, dest)\n", "            pass\n",
      "tests/test_run_attack.py", k="destination_that_cannot"),
    # -- the cluster's bucket ------------------------------------------------------------------
    m("bucket: object names may climb out of a run folder", "infra/storage/urls.py",
      '    if any(p in ("", ".", "..") for p in parts):', "    if False:",
      "tests/test_storage_config.py", k="climb_out"),
    m("bucket: a checkpoint index before the files it names", "infra/storage/uploader.py",
      "            if path.rsplit(\"/\", 1)[-1] == INDEX and self._waiting(now, path):",
      "            if False:",
      "tests/test_uploader.py", k="index"),
    m("bucket: folder markers refused as names that leave the run", "infra/storage/transfer.py",
      "        if is_folder_marker(blob.name, blob.size):\n", "        if False:\n",
      "tests/test_bucket_local.py", k="marker or console"),
    m("bucket: the uploader outlives the next job's chief", "infra/storage/uploader.py",
      "    run = task_run(watch)\n", "    run = None\n",
      "tests/test_uploader.py", k="next_jobs"),
    m("bucket: a node's upload state counts unchecked", "infra/bucket/commands.py",
      "not isinstance(value, int) or not 0 <= value <= MAX_COUNT:", "False:",
      "tests/test_uploader.py", k="not_counts"),
    m("bucket: up no longer checks the bucket", "infra/cluster/api.py",
      "        self.check_bucket()\n", "",
      "tests/test_bucket_local.py", k="refuses"),
    m("identity: nodes created with no scopes", "infra/providers/gce/instances.py",
      "scopes=identity.scope_urls(gce.scopes)", "scopes=[]",
      "tests/test_gce_identity.py", k="default_account_with"),
]


def copy_tree(dest: Path) -> None:
    shutil.copytree(REPO, dest, ignore=IGNORE, symlinks=True)


def run_tests(
    tree: Path, tests: tuple[str, ...], select: str = "", timeout: float = TIMEOUT_S
) -> tuple[bool, str]:
    """Whether the tests pass in ``tree`` (its code imported, not the
    installed one), and pytest's last lines."""
    env = dict(os.environ, PYTHONPATH=str(tree), PYTHONDONTWRITEBYTECODE="1")
    # The tests find MNIST beside the checkout (tests/conftest.py) or at a
    # MNIST_DIR that may be relative: both as seen from here, not the copy.
    mnist = os.environ.get("MNIST_DIR") or str(REPO.parent / "shared" / "datasets" / "mnist")
    env["MNIST_DIR"] = str(Path(mnist).resolve())
    argv = [
        sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider",
        "-m", "not docker and not e2e", *(["-k", select] if select else []), *tests,
    ]
    try:
        done = subprocess.run(
            argv, cwd=tree, env=env, capture_output=True, text=True, timeout=timeout,
            # Started in the background, this script may have SIGINT ignored,
            # which the tests' child would inherit: the tests of Ctrl-C need
            # Python's own handler.
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )
    except subprocess.TimeoutExpired:
        return False, f"timeout after {timeout:.0f} s"
    lines = (done.stdout + done.stderr).strip().splitlines()
    # 5: no tests collected (a wrong node id) must not count as caught.
    if done.returncode == 5:
        raise SystemExit(f"no tests ran for {tests}: {' | '.join(lines[-3:])}")
    # The test that failed (so a catch by a flaky test can be told apart),
    # else pytest's last line (an error while collecting, say).
    failed = [line for line in lines if line.startswith("FAILED ")]
    failed += [line for line in lines if line.startswith("ERROR ")]
    return done.returncode == 0, (failed or lines[-1:] or ["no output"])[0]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-k", default="", help="only mutations whose name contains this")
    parser.add_argument("--list", action="store_true", help="list the mutations and exit")
    parser.add_argument(
        "--no-baseline", action="store_true",
        help="skip checking that the targeted tests pass on the unmutated tree",
    )
    args = parser.parse_args()
    chosen = [x for x in MUTANTS if args.k.lower() in x.name.lower()]
    # Every snippet must be in the code exactly once before anything runs.
    errors = []
    for x in chosen:
        count = (REPO / x.file).read_text().count(x.old)
        if count != 1:
            what = "snippet not found" if count == 0 else f"snippet found {count} times"
            errors.append(f"ERROR {x.name}: {what} in {x.file}: {x.old!r}")
    if args.list:
        for x in chosen:
            print(f"{x.name:60} {x.file}")
    if errors:
        print("\n".join(errors))
        return 2
    if args.list:
        return 0

    with tempfile.TemporaryDirectory(prefix="tfcluster-mutants-") as tmp:
        tree = Path(tmp) / "tree"
        copy_tree(tree)
        if not args.no_baseline:
            every = tuple(dict.fromkeys(t for x in chosen for t in x.tests))
            ok, tail = run_tests(tree, every, timeout=BASELINE_TIMEOUT_S)
            if not ok:
                print(f"ERROR the targeted tests fail on the unmutated tree: {tail}")
                return 2
        caught = 0
        survived: list[str] = []
        for i, x in enumerate(chosen, 1):
            target = tree / x.file
            original = target.read_text()
            target.write_text(original.replace(x.old, x.new, 1))
            started = time.monotonic()
            try:
                ok, tail = run_tests(tree, x.tests, x.select)
            finally:
                target.write_text(original)
            took = time.monotonic() - started
            verdict = "survived" if ok else "caught"
            print(f"[{i:2}/{len(chosen)}] {verdict:8} {took:5.1f}s  {x.name}", flush=True)
            if not ok:
                print(f"{'':26}{tail}", flush=True)
            if ok:
                survived.append(x.name)
            else:
                caught += 1
    score = caught / len(chosen) if chosen else 1.0
    print(f"\nscore: {caught}/{len(chosen)} caught ({score:.0%}); threshold {THRESHOLD:.0%}")
    for name in survived:
        print(f"  survived: {name}")
    return 0 if score >= THRESHOLD else 1


if __name__ == "__main__":
    sys.exit(main())
