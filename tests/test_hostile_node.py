"""A compromised node must not write outside a fetch's destination.

The fake node (``tests/hostile_node.py``) is a real SSH server on
127.0.0.1: the transport reaches it through its own code (key login, host
key pinning, Fabric, SFTP), and its SFTP listings name entries that climb
out (``../x``, an absolute path, ``a/b``), symlinks, devices and fifos.
Every test checks the folders around the destination afterwards.
"""

from __future__ import annotations

import os
import shutil
import stat
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import paramiko
import pytest

from infra.config.loader import ClusterConfig, parse_config
from infra.errors import ConfigError, FetchLimitExceeded, HostKeyChanged, UnsafeRemoteEntry
from infra.jobs.job import Job
from infra.spec.job import JobRecord, JobSpec, Program
from infra.spec.tfconfig import TaskSpec
from infra.state.folder import ClusterState
from infra.state.keys import ensure_key_pair
from infra.transport.fetch import (
    STAGING_PREFIX,
    FetchLimits,
    StagingWatch,
    _merge_staged,
    _plain_name,
    rsync_fetch_args,
    run_watched,
)
from infra.transport.ssh import SshTarget, SshTransport
from tests.hostile_node import (
    CHAR,
    CONTENT,
    DIR,
    FIFO,
    FILE,
    LINK,
    MTIME,
    Entry,
    Listing,
    fake_node,
)

REMOTE = "tfcluster/runs/r1"


def _config(**fetch: object) -> ClusterConfig:
    return parse_config(
        {
            "name": "t",
            "provider": "ssh",
            "nodes": ["pc-1", "pc-2"],
            "roles": {"ps": "pc-1", "chief": "pc-1", "worker": "pc-2"},
            "hosts": {"pc-1": "127.0.0.1", "pc-2": "127.0.0.1"},
            "fetch": fetch,
        },
        source="test",
    )


@pytest.fixture
def key(tmp_path: Path) -> Path:
    path = tmp_path / "keys" / "id_ed25519"
    ensure_key_pair(path, "test")
    return path


def _transport(tmp_path: Path, key: Path, port: int, **fetch: object) -> SshTransport:
    """The node's transport; ``fetch``: cluster.yaml's fetch limits."""
    state = ClusterState("t", home=tmp_path / "home")
    return SshTransport(
        [SshTarget("pc-1", "127.0.0.1", port)],
        config=_config(**fetch),
        state=state,
        key_file=key,
    )


def _tree(root: Path) -> set[str]:
    """Every path under ``root`` (symlinks not followed), with its kind."""
    out = set()
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(folder) / name
            kind = "l" if path.is_symlink() else "d" if path.is_dir() else "f"
            out.add(f"{kind} {path.relative_to(root)}")
    return out


@pytest.fixture
def dest(tmp_path: Path) -> Path:
    """The destination, a few folders down, as `deploy.py fetch` makes it."""
    path = tmp_path / "project" / "runs" / "t" / "r1"
    path.parent.mkdir(parents=True)
    return path


def _listing(tree: Mapping[str, Sequence[Entry]]) -> Listing:
    # A copy as lists: what list_folder returns.
    return lambda path: list(tree[path]) if path in tree else None


HOSTILE: dict[str, tuple[list[Entry], str]] = {
    # case -> (the node's listing of REMOTE, what the error must say).
    # ('..' itself is dropped by paramiko's listdir_attr, as '.' is.)
    "climbs up": ([("ok.txt", FILE), ("..", DIR), ("../x", FILE)], "'tfcluster/runs/r1/../x'"),
    "climbs far": ([("../../../../x", FILE)], "../../../../x"),
    "slash": ([("a/b", FILE)], "'tfcluster/runs/r1/a/b'"),
    "symlink": ([("metrics.json", LINK)], "metrics.json': it is a symlink"),
    "fifo": ([("pipe", FIFO)], "pipe': it is a fifo"),
    "device": ([("sda", CHAR)], "sda': it is a device"),
    "no mode": ([("what", None)], "what': it is of unknown type"),
    "not utf-8": ([(b"\xff\xfe", FILE)], "not UTF-8"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_fetch_refuses_entries_that_leave_the_destination(
    case: str, tmp_path: Path, key: Path, dest: Path
) -> None:
    entries, says = HOSTILE[case]
    before = _tree(tmp_path)
    with (
        fake_node(paramiko.PKey.from_path(key), listing=_listing({REMOTE: entries})) as node,
        _transport(tmp_path, key, node.port) as transport,
        pytest.raises(UnsafeRemoteEntry) as caught,
    ):
        transport.fetch("pc-1", REMOTE, dest)
    message = str(caught.value)
    assert message.startswith("pc-1: refused to fetch "), message
    assert says in message and "\n" not in message
    assert caught.value.exit_code == 7
    # Nothing was written anywhere but the (empty) destination and the
    # cluster's own state (its pinned host key).
    after = _tree(tmp_path) - {"d project/runs/t/r1"}
    assert {p for p in after - before if not p.startswith(("d home", "f home"))} == set()
    assert list(dest.iterdir()) == []
    # Names are checked before any entry of the folder is fetched.
    assert not [r for r in node.requests if r[0] == "open"]


def test_fetch_refuses_an_absolute_name(tmp_path: Path, key: Path, dest: Path) -> None:
    target = tmp_path / "victim" / ".bashrc"
    target.parent.mkdir()
    target.write_text("# the operator's own\n")
    listing = {REMOTE: [("notes.txt", FILE), (str(target), FILE)]}
    with (
        fake_node(paramiko.PKey.from_path(key), listing=_listing(listing)) as node,
        _transport(tmp_path, key, node.port) as transport,
        pytest.raises(UnsafeRemoteEntry) as caught,
    ):
        transport.fetch("pc-1", REMOTE, dest)
    assert str(target) in str(caught.value)
    assert target.read_text() == "# the operator's own\n"
    assert list(dest.iterdir()) == []


def test_fetch_does_not_write_through_old_symlinks(tmp_path: Path, key: Path, dest: Path) -> None:
    """A destination that holds symlinks (an earlier `rsync -a` fetch kept
    the node's): a file arriving over one replaces the link, a folder
    arriving over one is refused; the files they point at stay as they were."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_text("mine\n")
    dest.mkdir()
    (dest / "metrics.json").symlink_to(outside / "secret")
    listing = {REMOTE: [("metrics.json", FILE)]}
    with (
        fake_node(paramiko.PKey.from_path(key), listing=_listing(listing)) as node,
        _transport(tmp_path, key, node.port) as transport,
    ):
        transport.fetch("pc-1", REMOTE, dest)
    assert (outside / "secret").read_text() == "mine\n"
    assert not (dest / "metrics.json").is_symlink()
    assert (dest / "metrics.json").read_bytes() == CONTENT

    (dest / "ckpt").symlink_to(outside)
    listing = {REMOTE: [("ckpt", DIR)], f"{REMOTE}/ckpt": [("secret", FILE)]}
    with (
        fake_node(paramiko.PKey.from_path(key), listing=_listing(listing)) as node,
        _transport(tmp_path, key, node.port) as transport,
        pytest.raises(UnsafeRemoteEntry) as caught,
    ):
        transport.fetch("pc-1", REMOTE, dest)
    assert "'tfcluster/runs/r1/ckpt'" in str(caught.value) and "not a real folder" in str(
        caught.value
    )
    assert "move " in (caught.value.hint or "")  # the fix is here, not on the node
    assert (outside / "secret").read_text() == "mine\n"


def test_fetch_refuses_endless_nesting(tmp_path: Path, key: Path, dest: Path) -> None:
    """A node that answers every listing with one more folder: refused
    (it was a RecursionError, a traceback)."""
    with (
        fake_node(
            paramiko.PKey.from_path(key),
            listing=lambda path: [("a", DIR)] if path.startswith(REMOTE) else None,
        ) as node,
        _transport(tmp_path, key, node.port) as transport,
        pytest.raises(UnsafeRemoteEntry) as caught,
    ):
        transport.fetch("pc-1", REMOTE, dest)
    assert "nest more than" in str(caught.value)


def test_fetch_of_a_plain_tree_still_works(tmp_path: Path, key: Path, dest: Path) -> None:
    listing = {
        REMOTE: [("metrics.jsonl", FILE), ("ckpt", DIR)],
        f"{REMOTE}/ckpt": [("ckpt-1.index", FILE)],
    }
    with (
        fake_node(paramiko.PKey.from_path(key), listing=_listing(listing)) as node,
        _transport(tmp_path, key, node.port) as transport,
    ):
        transport.fetch("pc-1", REMOTE, dest)
        assert _tree(dest) == {"f metrics.jsonl", "d ckpt", "f ckpt/ckpt-1.index"}
        assert (dest / "ckpt" / "ckpt-1.index").read_bytes() == CONTENT
        assert int((dest / "metrics.jsonl").stat().st_mtime) == MTIME
        umask = os.umask(0o022)
        os.umask(umask)
        assert (dest / "metrics.jsonl").stat().st_mode & 0o777 == 0o666 & ~umask
        opened = len([r for r in node.requests if r[0] == "open"])
        # Again: same size and time, nothing is downloaded.
        transport.fetch("pc-1", REMOTE, dest)
        assert len([r for r in node.requests if r[0] == "open"]) == opened
    assert not [p for p in dest.rglob("*") if p.name.startswith(STAGING_PREFIX)]


def test_plain_names() -> None:
    for bad in ("", ".", "..", "../x", "/abs", "a/b", "a\0b"):
        with pytest.raises(UnsafeRemoteEntry):
            _plain_name("pc-1", "runs", bad)
    assert _plain_name("pc-1", "runs", "..hidden") == "..hidden"


# -- a changed host key is never a warning --------------------------------------


def test_changed_host_key_while_following_is_exit_8(tmp_path: Path, key: Path) -> None:
    """It was a JobFailed (exit 9: 'lost contact with the chief')."""
    with fake_node(paramiko.PKey.from_path(key), listing=_listing({})) as node:
        with _transport(tmp_path, key, node.port) as transport:
            transport.connection("pc-1")  # first contact pins the key
        node.rekey()
        with _transport(tmp_path, key, node.port) as transport:
            job = _job(transport)
            with pytest.raises(HostKeyChanged) as caught:
                job.follow()
    assert caught.value.exit_code == 8


def test_changed_host_key_at_the_fetch_after_training_is_exit_8(
    tmp_path: Path, key: Path, dest: Path
) -> None:
    """The node is re-created (another host key) between the end of the
    job and the fetch: it was a warning and exit 0."""

    class Reboots(SshTransport):
        # What a node that restarts right after the job looks like: the
        # connection that followed the log is gone, the next one meets
        # another host key.
        def stream(self, node: str, *args: object, **kwargs: object) -> int:
            code = super().stream(node, *args, **kwargs)  # type: ignore[arg-type]
            self._drop(node)
            fake.rekey()
            return code

    with fake_node(
        paramiko.PKey.from_path(key),
        listing=_listing({REMOTE: []}),
        follow_output="@tfcluster-exit 0\n",
    ) as fake:
        state = ClusterState("t", home=tmp_path / "home")
        transport = Reboots(
            [SshTarget("pc-1", "127.0.0.1", fake.port)],
            config=_config(),
            state=state,
            key_file=key,
        )
        with transport:
            job = _job(transport)
            with pytest.raises(HostKeyChanged):
                job.watch(dest)
    assert not dest.exists() or list(dest.iterdir()) == []


def _job(transport: SshTransport) -> Job:
    chief = TaskSpec(type="chief", index=0, node="pc-1", host="127.0.0.1", port=2222)
    spec = JobSpec(run_id="r1", program=Program(argv=("true",), task_types=("chief",)))
    job = Job(transport, [chief], spec)
    job.output_dir = REMOTE
    return job


# -- run ids read back from the state file -------------------------------------------


@pytest.mark.parametrize(
    "run_id", ["../x", "../../../home/me", "/abs", "a/b", ".", "..", "", 7, None]
)
def test_a_run_id_that_is_not_a_folder_name_is_refused(run_id: object) -> None:
    data = {"run_id": run_id, "chief_node": "pc-1", "output_dir": "tfcluster/runs/x"}
    with pytest.raises(ValueError, match=r"^run_id") as caught:
        JobRecord.from_dict(data)
    assert "\n" not in str(caught.value)


def test_a_run_id_from_new_run_id_reads_back() -> None:
    from infra.spec.job import new_run_id

    run_id = new_run_id("mnist-async")
    chief = {"type": "chief", "index": 0, "node": "pc-1", "host": "10.0.0.1", "port": 2224}
    data = {
        "run_id": run_id,
        "chief_node": "pc-1",
        "output_dir": f"tfcluster/runs/{run_id}",
        "tasks": [chief],
    }
    assert JobRecord.from_dict(data).run_id == run_id


# -- rsync -----------------------------------------------------------------------------


def test_rsync_fetch_arguments(tmp_path: Path) -> None:
    args = rsync_fetch_args("me@h:tfcluster/runs/r1/", tmp_path / "stage", tmp_path, 120.0)
    # No -a, -l, -D, -p: no symlink, device or mode comes from the node.
    assert not {"-a", "-l", "-D", "-p", "--links", "--devices", "--specials", "--perms"} & set(args)
    assert not [
        a for a in args if a.startswith("-") and not a.startswith("--") and set(a) & set("alDpgo")
    ]
    assert "--safe-links" in args and "-s" in args and "--timeout=120" in args
    assert f"--link-dest={tmp_path.resolve()}" in args
    assert args[-3:] == ["--", "me@h:tfcluster/runs/r1/", f"{tmp_path / 'stage'}/"]


def test_staged_symlinks_and_fifos_are_refused(tmp_path: Path) -> None:
    """What rsync left in the fresh folder is checked before anything moves
    (in case a node's rsync gets one past the flags)."""
    dest = tmp_path / "dest"
    staging = dest / f"{STAGING_PREFIX}x"
    (staging / "sub").mkdir(parents=True)
    (staging / "a.txt").write_text("a")
    (staging / "sub" / "link").symlink_to(tmp_path)
    with pytest.raises(UnsafeRemoteEntry) as caught:
        _merge_staged("pc-1", staging, dest, "runs/r1")
    assert "'runs/r1/sub/link': it is a symlink" in str(caught.value)
    assert _tree(dest) == {
        f"d {staging.name}",
        f"f {staging.name}/a.txt",
        f"d {staging.name}/sub",
        f"l {staging.name}/sub/link",
    }
    (staging / "sub" / "link").unlink()
    os.mkfifo(staging / "sub" / "pipe")
    with pytest.raises(UnsafeRemoteEntry, match="it is a fifo"):
        _merge_staged("pc-1", staging, dest, "runs/r1")
    (staging / "sub" / "pipe").unlink()
    (staging / "sub" / "b.txt").write_text("b")
    _merge_staged("pc-1", staging, dest, "runs/r1")
    assert (dest / "a.txt").read_text() == "a" and (dest / "sub" / "b.txt").read_text() == "b"


@pytest.fixture
def node_home(tmp_path: Path) -> Iterator[Path]:
    home = tmp_path / "node"
    run = home / REMOTE
    (run / "ckpt").mkdir(parents=True)
    (run / "metrics.jsonl").write_text("{}\n")
    (run / "ckpt" / "ckpt-1.index").write_text("i\n")
    (run / "passwd").symlink_to("/etc/passwd")
    (run / "up").symlink_to("../../../../../../outside")
    (run / "ckpt" / "home").symlink_to(tmp_path)
    os.mkfifo(run / "fifo")
    yield home


@pytest.mark.skipif(shutil.which("rsync") is None, reason="needs a local rsync")
def test_rsync_fetch_brings_no_symlink_or_special_file(
    tmp_path: Path, key: Path, dest: Path, node_home: Path
) -> None:
    """The real rsync, over the system ssh, against the node: its symlinks
    and fifo stay there; plain files arrive; nothing lands outside."""
    before = _tree(tmp_path)
    with (
        fake_node(paramiko.PKey.from_path(key), home=node_home) as node,
        _transport(tmp_path, key, node.port) as transport,
    ):
        transport.fetch("pc-1", REMOTE, dest)
        transport.fetch("pc-1", REMOTE, dest)  # again, over what is there
    assert any(c.startswith("rsync --server --sender") for c in node.commands), node.commands
    assert _tree(dest) == {"f metrics.jsonl", "d ckpt", "f ckpt/ckpt-1.index"}
    new = {
        p
        for p in _tree(tmp_path) - before
        if not p.split(" ", 1)[1].startswith(("home", "project"))
    }
    assert new == set()
    assert all(stat.S_ISREG(p.lstat().st_mode) for p in dest.rglob("*") if not p.is_dir())


def test_sftp_fetch_of_a_real_tree_with_a_symlink_is_refused(
    tmp_path: Path, key: Path, dest: Path, node_home: Path
) -> None:
    """Without rsync on the node: SFTP lists the symlinks as they are
    (lstat), and the fetch refuses the first one before writing it."""
    before = _tree(tmp_path)
    with (
        fake_node(paramiko.PKey.from_path(key), home=node_home) as node,
        _transport(tmp_path, key, node.port) as transport,
    ):
        transport.note_rsync("pc-1", False)
        with pytest.raises(UnsafeRemoteEntry) as caught:
            transport.fetch("pc-1", REMOTE, dest)
    assert "it is a symlink" in str(caught.value) or "it is a fifo" in str(caught.value)
    new = {
        p
        for p in _tree(tmp_path) - before
        if not p.split(" ", 1)[1].startswith(("home", "project"))
    }
    assert new == set()
    assert not [p for p in dest.rglob("*") if p.is_symlink()]


# -- the whole command: `deploy.py fetch` against the node ------------------------------


def _cli_cluster(tmp_path: Path, key: Path, port: int, run_id: object, more: str = "") -> Path:
    config = tmp_path / "cluster.yaml"
    config.write_text(
        "name: hostile\nprovider: ssh\nnodes: [pc-1, pc-2]\n"
        "roles: {ps: pc-1, chief: pc-1, worker: pc-2}\n"
        f"hosts: {{pc-1: '127.0.0.1:{port}', pc-2: '127.0.0.1:{port}'}}\n"
        f"ssh: {{key_file: '{key}'}}\n" + more
    )
    chief = {"type": "chief", "index": 0, "node": "pc-1", "host": "127.0.0.1", "port": 2222}
    ClusterState("hostile").update(
        last_job={"run_id": run_id, "chief_node": "pc-1", "output_dir": REMOTE, "tasks": [chief]}
    )
    return config


def _deploy(*args: str) -> tuple[int, str]:
    from click.testing import CliRunner

    from deploy import cli

    result = CliRunner().invoke(cli, list(args), catch_exceptions=False)
    return result.exit_code, result.output


@pytest.mark.parametrize(
    "entry",
    [("../../../../x", FILE), ("[/]", FILE), ("[red]pc-1[/red]", LINK)],
    ids=["climbs", "markup-slash", "markup-symlink"],
)
def test_deploy_fetch_from_a_hostile_node_fails_with_one_line(
    tmp_path: Path, key: Path, dest: Path, entry: Entry
) -> None:
    """Through the CLI: the node's name is shown as it is (as data: it was
    Rich markup, and '[/]' crashed the error display with a traceback)."""
    listing = {REMOTE: [("summary.json", FILE), entry]}
    before = _tree(tmp_path)
    with fake_node(paramiko.PKey.from_path(key), listing=_listing(listing)) as node:
        config = _cli_cluster(tmp_path, key, node.port, "r1")
        code, out = _deploy("-c", str(config), "fetch", "--dest", str(dest.parent))
    assert code == 7, out
    assert out.startswith(f"error: pc-1: refused to fetch {REMOTE + '/' + str(entry[0])!r}"), out
    assert len(out.strip().splitlines()) == 2 and "hint: " in out  # the error and its hint
    new = {p for p in _tree(tmp_path) - before if p.split(" ", 1)[1].startswith("project")}
    assert new == {"d project/runs/t/r1"}


@pytest.mark.parametrize("run_id", ["../x", "/tmp/x", "a/../../b"])
def test_deploy_fetch_refuses_a_run_id_that_climbs(
    tmp_path: Path, key: Path, dest: Path, run_id: str
) -> None:
    with fake_node(paramiko.PKey.from_path(key), listing=_listing({REMOTE: []})) as node:
        config = _cli_cluster(tmp_path, key, node.port, run_id)
        code, out = _deploy("-c", str(config), "fetch", "--dest", str(dest))
    # The record is set aside with one warning (the state file was edited
    # or damaged), so there is no job to fetch: nothing is asked of the node
    # and nothing is written.
    assert code == 3, out
    flat = " ".join(out.split())  # the warning is wrapped at the terminal width
    assert "is not a run id" in flat and "set aside" in flat, out
    assert "error: no job to fetch yet" in out, out
    assert not dest.exists() and not node.commands and not node.requests


@pytest.mark.skipif(shutil.which("rsync") is None, reason="needs a local rsync")
def test_rsync_meeting_another_host_key_is_exit_8(
    tmp_path: Path, key: Path, dest: Path, node_home: Path
) -> None:
    """The paramiko connection was made before the key changed (someone in
    the middle of new connections only): the system ssh under rsync refuses
    the new key, and that is a HostKeyChanged too (was exit 7, a warning
    at the end of train)."""
    with (
        fake_node(paramiko.PKey.from_path(key), home=node_home) as node,
        _transport(tmp_path, key, node.port) as transport,
    ):
        transport.connection("pc-1")
        node.rekey()
        with pytest.raises(HostKeyChanged) as caught:
            transport.fetch("pc-1", REMOTE, dest)
    assert str(caught.value).startswith("pc-1: ") and "\n" not in str(caught.value)
    assert caught.value.exit_code == 8


# -- what a fetch takes at most: cluster.yaml's fetch limits -----------------------------


def _leftovers(dest: Path) -> list[Path]:
    return [p for p in dest.rglob("*") if p.name.startswith(STAGING_PREFIX)]


def test_a_file_that_streams_past_its_declared_size_is_read_to_that_size(
    tmp_path: Path, key: Path, dest: Path
) -> None:
    """paramiko's getfo read on to the end the node chose: a "20-byte" file
    streamed 8.6 MB in 10 s and went on. Reads are asked for up to the
    declared size only."""
    listing = {REMOTE: [("events.out", FILE), ("metrics.jsonl", FILE)]}
    with (
        fake_node(paramiko.PKey.from_path(key), listing=_listing(listing), streaming=True) as node,
        _transport(tmp_path, key, node.port) as transport,
    ):
        transport.fetch("pc-1", REMOTE, dest)
    for name in ("events.out", "metrics.jsonl"):
        assert (dest / name).read_bytes() == b"x" * len(CONTENT)
    assert node.reads and max(node.reads) < len(CONTENT)
    assert not _leftovers(dest)


def test_more_entries_than_the_limit_is_one_line_naming_the_entry(
    tmp_path: Path, key: Path, dest: Path
) -> None:
    listing = {
        REMOTE: [("ckpt", DIR), ("a", FILE)],
        f"{REMOTE}/ckpt": [(f"f{i}", FILE) for i in range(10_000)],
    }
    with (
        fake_node(paramiko.PKey.from_path(key), listing=_listing(listing)) as node,
        _transport(tmp_path, key, node.port, max_entries=5) as transport,
        pytest.raises(FetchLimitExceeded) as caught,
    ):
        transport.fetch("pc-1", REMOTE, dest)
    message = str(caught.value)
    assert message == (
        f"pc-1: '{REMOTE}/ckpt/f3' takes the run folder past 5 files and folders "
        "(fetch.max_entries); it was not kept"
    )
    assert caught.value.exit_code == 7 and "fetch" in (caught.value.hint or "")
    # Checked as the listing came: nothing of that folder was opened.
    assert not [r for r in node.requests if r[0] == "open" and "/ckpt/" in r[1]]
    assert not _leftovers(dest)


def test_a_run_folder_past_the_size_limit_stops_at_the_file_that_passes_it(
    tmp_path: Path, key: Path, dest: Path
) -> None:
    """Declared sizes are counted before a file is read: with room for
    two files of CONTENT, the third is refused unread, the two before it
    are whole (no partial file under a file's name)."""
    listing = {REMOTE: [("a", FILE), ("b", FILE), ("c", FILE), ("d", FILE)]}
    limit_gb = 2.5 * len(CONTENT) / 1e9
    with (
        fake_node(paramiko.PKey.from_path(key), listing=_listing(listing)) as node,
        _transport(tmp_path, key, node.port, max_gb=limit_gb) as transport,
        pytest.raises(FetchLimitExceeded, match=f"'{REMOTE}/c' takes the run folder past 5e-08 GB"),
    ):
        transport.fetch("pc-1", REMOTE, dest)
    assert sorted(p.name for p in dest.iterdir()) == ["a", "b"]
    assert (dest / "b").read_bytes() == CONTENT
    assert ("open", f"{REMOTE}/c") not in node.requests


def test_a_node_that_never_answers_the_listing_times_out(
    tmp_path: Path, key: Path, dest: Path
) -> None:
    """It blocked `train`'s fetch at the end for ever."""
    with (
        fake_node(
            paramiko.PKey.from_path(key), listing=_listing({REMOTE: []}), silent_listing=True
        ) as node,
        _transport(tmp_path, key, node.port, timeout=1) as transport,
        pytest.raises(FetchLimitExceeded) as caught,
    ):
        transport.fetch("pc-1", REMOTE, dest)
    assert str(caught.value) == (
        f"pc-1: no answer for 1 s while fetching '{REMOTE}' (fetch.timeout)"
    )


def test_the_end_of_a_job_with_a_silent_node_is_a_warning_not_a_hang(
    tmp_path: Path, key: Path, dest: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with (
        fake_node(
            paramiko.PKey.from_path(key),
            listing=_listing({REMOTE: []}),
            follow_output="@tfcluster-exit 0\n",
            silent_listing=True,
        ) as node,
        _transport(tmp_path, key, node.port, timeout=1) as transport,
    ):
        assert _job(transport).watch(dest) == 0
    assert "could not fetch the run folder: pc-1: no answer for 1 s" in caplog.text
    assert "raise it in cluster.yaml's fetch section" in caplog.text


@pytest.mark.parametrize(
    ("fetch", "says"),
    [
        ({"max_entries": 3}, f"'{REMOTE}/ckpt/ckpt-1.index' takes the run folder past 3 files"),
        ({"max_gb": 4e-6}, f"'{REMOTE}/big' takes the run folder past 4e-06 GB"),
    ],
)
@pytest.mark.skipif(shutil.which("rsync") is None, reason="needs a local rsync")
def test_rsync_fetch_past_a_limit_leaves_nothing(
    tmp_path: Path, key: Path, dest: Path, fetch: dict[str, float], says: str
) -> None:
    home = tmp_path / "node"
    run = home / REMOTE
    (run / "ckpt").mkdir(parents=True)
    (run / "metrics.jsonl").write_text("{}\n")
    (run / "ckpt" / "ckpt-1.index").write_text("i\n")
    (run / "big").write_bytes(b"b" * 5000)
    dest.mkdir()
    (dest / "kept").write_text("from before\n")
    with (
        fake_node(paramiko.PKey.from_path(key), home=home) as node,
        _transport(tmp_path, key, node.port, **fetch) as transport,
        pytest.raises(FetchLimitExceeded) as caught,
    ):
        transport.fetch("pc-1", REMOTE, dest)
    assert any(c.startswith("rsync --server --sender") for c in node.commands), node.commands
    assert str(caught.value).startswith(f"pc-1: {says}")
    assert str(caught.value).endswith("it was not kept")
    assert _tree(dest) == {"f kept"}  # the staging folder is gone, nothing of it landed


@pytest.mark.skipif(shutil.which("rsync") is None, reason="needs a local rsync")
def test_rsync_from_a_node_whose_rsync_never_answers_times_out(
    tmp_path: Path, key: Path, dest: Path
) -> None:
    """The node's rsync reads and says nothing; rsync's --timeout ends it."""
    home, bin = tmp_path / "node", tmp_path / "bin"
    (home / REMOTE).mkdir(parents=True)
    bin.mkdir()
    (bin / "rsync").write_text("#!/bin/sh\nexec cat >/dev/null\n")
    (bin / "rsync").chmod(0o755)
    with (
        fake_node(paramiko.PKey.from_path(key), home=home, bin=bin) as node,
        _transport(tmp_path, key, node.port, timeout=1) as transport,
        pytest.raises(FetchLimitExceeded, match=r"^pc-1: no answer for 1 s while fetching"),
    ):
        transport.fetch("pc-1", REMOTE, dest)
    assert _tree(dest) == set()


def _gone(pid: int) -> bool:
    """``pid`` has ended (a zombie nobody reaped yet counts as ended)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def test_a_writer_past_the_limit_is_stopped_while_it_writes(tmp_path: Path) -> None:
    """What rsync's receiver writes is whatever the node's rsync sends: the
    watch stops it mid-stream (here a writer of ten times the limit, with a child
    as rsync has its ssh), the whole process group, and names the file
    (rsync's temporary name read back as the node's)."""
    staging = tmp_path / "stage"
    staging.mkdir()
    writer = (
        "import os, sys, time\n"
        "child = os.fork()\n"
        "with open(sys.argv[1] + '/.pids', 'a') as f:\n"
        "    f.write(f'{os.getpid()}\\n')\n"
        "name = '/.events.out.Ab12Cd' if child else '/.ckpt.Zz99Yy'\n"
        # Bounded (50 MB, ten times the limit): a watch that failed to stop
        # it makes this test fail, never the disk fill up.
        "with open(sys.argv[1] + name, 'wb') as f:\n"
        "    for _ in range(800):\n"
        "        f.write(b'x' * 65536)\n"
        "        f.flush()\n"
        "        time.sleep(0.002)\n"
    )
    limits = FetchLimits(max_bytes=5_000_000, max_entries=10, timeout=5)
    watch = StagingWatch("pc-1", REMOTE, staging, limits)
    with pytest.raises(FetchLimitExceeded) as caught:
        run_watched([sys.executable, "-c", writer, str(staging)], timeout=None, watch=watch)
    message = str(caught.value)
    assert (
        message.startswith(f"pc-1: '{REMOTE}/") and "takes the run folder past 0.005 GB" in message
    )
    assert f"'{REMOTE}/events.out'" in message or f"'{REMOTE}/ckpt'" in message
    pids = [int(p) for p in (staging / ".pids").read_text().split()]
    assert len(pids) == 2
    deadline = time.monotonic() + 10
    while not all(_gone(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert all(_gone(pid) for pid in pids)


def test_fetch_limits_in_cluster_yaml_are_typed_and_strict() -> None:
    assert _config().fetch.limits() == FetchLimits(50_000_000_000, 100_000, 120.0)
    assert _config(max_gb=2, timeout=30).fetch.limits().max_bytes == 2_000_000_000
    cases: list[tuple[dict[str, object], str]] = [
        ({"max_gb": 0}, "fetch.max_gb"),
        ({"max_gb": "20G"}, "fetch.max_gb"),
        ({"max_entries": 1.5}, "fetch.max_entries"),
        ({"timeout": True}, "fetch.timeout"),
        ({"max_bytes": 1}, "did you mean"),
    ]
    for bad, says in cases:
        with pytest.raises(ConfigError, match=says):
            _config(**bad)


def test_deploy_fetch_past_a_limit_is_one_line_and_its_hint(
    tmp_path: Path, key: Path, dest: Path
) -> None:
    listing = {REMOTE: [(f"events-{i}", FILE) for i in range(50)]}
    with fake_node(paramiko.PKey.from_path(key), listing=_listing(listing)) as node:
        config = _cli_cluster(tmp_path, key, node.port, "r1", "fetch: {max_entries: 10}\n")
        code, out = _deploy("-c", str(config), "fetch", "--dest", str(dest.parent))
    assert code == 7, out
    lines = out.strip().splitlines()
    assert lines[0] == (
        f"error: pc-1: '{REMOTE}/events-10' takes the run folder past 10 files and folders "
        "(fetch.max_entries); it was not kept"
    ), out
    assert len(lines) == 2 and lines[1].startswith("hint: if the run folder really is that large")
