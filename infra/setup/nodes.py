"""Set up the nodes: what ``up`` does on every node once it runs, and ``train`` before a job.

Per node, all nodes at once (``infra/transport/fanout.py``): one probe (folders made,
is the install current, which tools are there, what files are where), then
the install if it is not current (``infra/setup/install.py``), the GPU check, the
sync of code and data (``infra/setup/sync.py``), and with a working folder its
``requirements.txt``. What happened is a ``SetupReport``
(``infra/setup/report.py``); the shell text is in ``infra/setup/commands.py``
and its parsers in ``infra/setup/facts.py``.

Which install a config gets is decided here (``install_plan``): on GPU nodes
(``gce.accelerator``, or a G2/A2/A3 machine type) the node gets
``tensorflow[and-cuda]`` of the pinned version instead of tensorflow-cpu.
pip brings CUDA and cuDNN as wheels, but the NVIDIA *driver* must come with
the machine: a Deep Learning VM image installs it on first boot (the gce
provider sets ``install-nvidia-driver=True``; config refuses GPUs on the
stock Debian/Ubuntu images). After the install, every GPU node must have
TensorFlow see all its GPUs (``probes.gpu_check``, waiting for a
first-boot driver install), else setup fails: no silent CPU run on a GPU
bill.

``python -m tfcluster_cli.compose marker --config FILE`` prints the install marker
(the node image's ``BAKE_VENV=1`` build writes it).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from pathlib import Path

from infra.config.loader import ClusterConfig
from infra.config.providers import provider_class
from infra.errors import ConfigError, RemoteError, StateError, combine_errors
from infra.node import probes
from infra.node.facts import parse_gpu_check
from infra.setup.commands import probe_command
from infra.setup.facts import Probe, parse_listing, parse_probe
from infra.setup.install import (
    CONSTRAINTS,
    DEFAULT_REQUIREMENTS,
    NO_DEPS_REQUIREMENTS,
    InstallPlan,
    gpu_requirements,
    install_user_requirements,
    install_venv,
    requirements_file,
    wheelhouse_listing,
)
from infra.setup.report import NodeSetup, OnEvent, SetupReport
from infra.setup.sync import sync_stale
from infra.setup.sync_items import (
    PROJECT_ROOT,
    SyncItem,
    expand_vars,
    secret_paths,
    sync_items,
    workdir_item,
)
from infra.transport.base import NodeLayout, Transport
from infra.transport.fanout import fan_out

log = logging.getLogger("tfcluster")


# -- what to install ----------------------------------------------------------------


def expected_gpus(config: ClusterConfig) -> int:
    """GPUs per node, as the provider says (gce: gce.accelerator's, or
    those of a G2/A2/A3 machine type)."""
    return provider_class(config.provider).gpus_per_node(config)


def install_plan(config: ClusterConfig) -> InstallPlan:
    """What ``config``'s nodes get installed (``InstallPlan``, infra/setup/install.py).
    Here rather than there because it asks ``expected_gpus``."""
    requirements = requirements_file(config)
    text = requirements.read_text()
    # The tested versions of everything the trainer pulls in (protobuf and
    # grpcio speak between the nodes): with the project's own requirements
    # only, as a user's own list may pin other versions.
    default = requirements == (PROJECT_ROOT / DEFAULT_REQUIREMENTS).resolve()
    constraints = CONSTRAINTS.read_text() if default and CONSTRAINTS.is_file() else ""
    no_deps = NO_DEPS_REQUIREMENTS.read_text() if default else ""
    gpu = expected_gpus(config) > 0
    wheelhouse = None
    wheels = None
    if config.setup.wheelhouse:
        wheelhouse = config.resolve(expand_vars(config.setup.wheelhouse, "setup.wheelhouse"))
        if not wheelhouse.is_dir():
            raise ConfigError(
                f"setup.wheelhouse: {wheelhouse} is not a folder; make one with "
                "docker/build-wheelhouse.sh DIR (pip download of the requirements)"
            )
        wheels = wheelhouse_listing(wheelhouse)
        if not wheels:
            raise ConfigError(f"setup.wheelhouse: {wheelhouse} holds no .whl files")
    return InstallPlan(
        requirements=gpu_requirements(text) if gpu else text,
        python=config.setup.python,
        wheels=wheels,
        commands=tuple(config.setup.commands),
        gpu=gpu,
        wheelhouse=wheelhouse,
        constraints=constraints,
        no_deps=no_deps,
    )


# -- doing it ---------------------------------------------------------------------------


def _setup_node(
    transport: Transport,
    node: str,
    config: ClusterConfig,
    plan: InstallPlan | None,
    on_event: OnEvent,
    workdir: Path | None = None,
    sync: bool = True,
) -> NodeSetup:
    """Probe, install (with ``plan``), check the GPUs and sync (unless
    ``sync`` is False) one node; with ``workdir`` its working folder and
    requirements.txt too."""
    started = time.monotonic()
    report = NodeSetup(node)
    layout = transport.layout(node)
    items = sync_items(config, layout)
    work = (
        workdir_item(workdir, transport.workdir(node, workdir), secret_paths(config))
        if workdir
        else None
    )
    if work is not None:
        items.append(work)
    probe, listing = _probe(transport, node, layout, plan, items)
    use_rsync = probe.rsync and transport.has_local_rsync()
    if plan is not None:
        if probe.installed:
            report.install = "already installed"
        else:
            plan = install_venv(
                transport, node, config, plan, report, rsync=use_rsync, on_event=on_event
            )
        if plan.gpu:
            report.gpus = _check_gpus(transport, node, config, layout, on_event)
    if not sync:
        report.seconds = time.monotonic() - started
        return report
    stats, report.method = sync_stale(transport, node, items, listing, rsync=use_rsync)
    report.files, report.bytes, report.deleted = stats.files, stats.bytes, stats.deleted
    if work is not None:
        report.requirements = install_user_requirements(transport, node, config, work, on_event)
    report.seconds = time.monotonic() - started
    return report


def _probe(
    transport: Transport,
    node: str,
    layout: NodeLayout,
    plan: InstallPlan | None,
    items: Sequence[SyncItem],
) -> tuple[Probe, dict[str, tuple[int, int]] | None]:
    """One round trip: the node's folders made, whether its install is
    current, its tools (noted on the transport), and its file listing for
    the quick check. RemoteError when the node can sync no files at all."""
    fingerprint = plan.fingerprint if plan else ""
    also = plan.with_system_tf().fingerprint if plan and plan.tensorflow else None
    probed = transport.run(node, probe_command(layout, fingerprint, items, also), timeout=60)
    if not probed.ok:
        raise RemoteError(f"{node}: preparing {layout.root} failed: {probed.tail()}")
    probe = parse_probe(probed.stdout)
    transport.note_rsync(node, probe.rsync)
    use_rsync = probe.rsync and transport.has_local_rsync()
    if not use_rsync and not (probe.sha256sum and probe.tools.get("tar", False)):
        raise RemoteError(
            f"{node}: has neither rsync nor sha256sum+tar to sync files with; "
            "install rsync there (sudo apt-get install rsync)"
        )
    return probe, parse_listing(probed.stdout, layout)


def _check_gpus(
    transport: Transport, node: str, config: ClusterConfig, layout: NodeLayout,
    on_event: OnEvent,
) -> int:
    """How many GPUs TensorFlow sees on ``node``; RemoteError when fewer than
    the node has: no silent CPU run on a GPU bill."""
    want = expected_gpus(config)
    on_event(node, "checking that TensorFlow sees the GPUs")
    result = transport.run(node, probes.gpu_check(layout), timeout=probes.DRIVER_WAIT_S + 300)
    check = parse_gpu_check(result.stdout)
    seen = check.tf_gpus or 0
    if seen >= want:
        return seen
    if not check.driver:
        why = "the NVIDIA driver is not working (nvidia-smi lists no GPU)"
    elif check.tf_gpus is None:
        why = f"TensorFlow failed to start: {result.tail(2)}"
    else:
        why = "TensorFlow lacks its CUDA libraries or does not match the driver"
    raise RemoteError(
        f"{node}: TensorFlow sees {seen} of its {want} GPU{'s' * (want != 1)}: {why}",
        hint="training would run on the CPU while the GPUs are billed: use a Deep Learning VM "
        "image (gce.image: projects/deeplearning-platform-release/global/images/family/...), "
        "or `deploy.py down` to stop paying",
    )


def setup_nodes(
    transport: Transport,
    config: ClusterConfig,
    *,
    on_event: OnEvent | None = None,
    install: bool = True,
    check: bool = True,
    workdir: Path | None = None,
    sync: bool = True,
) -> SetupReport:
    """Install (unless ``install`` is False) and sync (unless ``sync`` is
    False) on every node of ``transport``, all at once. Each node's outcome is in the report; with
    ``check`` a failure on any node raises one ``RemoteError`` naming each
    failed node (its ``report`` attribute holds the whole report)."""
    if not transport.copies_files:
        raise StateError(
            f"install and sync need SSH nodes; {type(transport).__name__} nodes run this "
            "checkout directly"
        )
    started = time.monotonic()
    emit: OnEvent = on_event or (lambda node, what: None)
    plan = install_plan(config) if install else None
    for node in transport.nodes:  # config mistakes surface once, before any node work
        sync_items(config, transport.layout(node))
    done = fan_out(
        lambda node: _setup_node(transport, node, config, plan, emit, workdir, sync),
        transport.nodes,
    )
    reports = {
        node: done.results[node]
        if node in done.results
        else NodeSetup(node, install="failed", error=str(done.errors[node]))
        for node in transport.nodes
    }
    report = SetupReport(reports, time.monotonic() - started)
    if check and done.errors:
        combined = combine_errors(done.errors)
        failure = type(combined)(f"setup failed: {combined}", hint=combined.hint)
        failure.report = report  # type: ignore[attr-defined]
        raise failure
    return report


def sync_nodes(
    transport: Transport,
    config: ClusterConfig,
    *,
    on_event: OnEvent | None = None,
    check: bool = True,
    workdir: Path | None = None,
) -> SetupReport:
    """Only the incremental code and data sync (``train`` does this first),
    and with ``workdir`` the user's working folder (``run``, ``exec``)."""
    return setup_nodes(
        transport, config, on_event=on_event, install=False, check=check, workdir=workdir
    )
