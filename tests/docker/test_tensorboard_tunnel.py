"""`deploy.py tensorboard`'s remote half against a real sshd node: the
``tensorboard`` task started with the job's commands on the node, its port
read from its log, an SSH tunnel from a local port to the node's
127.0.0.1, and the task stopped at the end. On the bare node (a fresh VM,
no install: that is what the TensorFlow-free part needs), so the served
program is a stand-in that prints TensorBoard's start line and answers
HTTP (`python -m tensorboard.main` finds it in the login's home, the
task's folder); real TensorBoard over HTTP is tests/test_first_minutes.py's,
on the local cluster."""

from __future__ import annotations

import urllib.request
from pathlib import Path

import pytest

from infra.jobs.tensorboard import TensorBoardTask, serve
from tests.docker.conftest import StartNode, ssh_config, transport_for, write_config

pytestmark = pytest.mark.docker

STAND_IN = '''\
import http.server, socketserver, sys
logdir = sys.argv[sys.argv.index("--logdir") + 1]
class Answer(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = ("logdir " + logdir).encode()
        self.send_response(200)
        self.end_headers()
        self.wfile.write(body)
server = socketserver.TCPServer(("127.0.0.1", 0), Answer)
print(f"TensorBoard 0.0.0 at http://127.0.0.1:{server.server_address[1]}/ (Press CTRL+C to quit)",
      file=sys.stderr, flush=True)
server.serve_forever()
'''


def test_tensorboard_is_reached_through_an_ssh_tunnel_and_stopped(
    tmp_path: Path, bare_image: str, start_node: StartNode, node_key: tuple[Path, str]
) -> None:
    key = node_key[0]
    node = start_node(bare_image)
    config = write_config(
        tmp_path,
        ssh_config("t", {"pc-1": {"address": "127.0.0.1", "port": node.port}}, key),
    )
    with transport_for(config, key, [node.target()], tmp_path / "home") as transport:
        transport.wait_ready(timeout=60)
        home = transport.run("pc-1", "pwd").stdout.strip()
        # The node environment's `python`, as setup would make it.
        layout = transport.layout("pc-1")
        transport.run("pc-1", f"mkdir -p {layout.bin} && ln -s /usr/bin/python3 {layout.python}")
        transport.run("pc-1", "mkdir -p tensorboard && touch tensorboard/__init__.py")
        transport.upload("pc-1", STAND_IN.encode(), f"{home}/tensorboard/main.py")
        with serve(transport, "pc-1", "tfcluster/runs/r-1", 0) as board:
            assert board.url.startswith("http://127.0.0.1:") and board.remote_port > 0
            # Only the node's loopback: the tunnel is the way in.
            assert str(board.remote_port) not in board.url
            with urllib.request.urlopen(board.url, timeout=30) as answer:
                assert answer.read() == b"logdir tfcluster/runs/r-1"
            assert TensorBoardTask(transport, "pc-1", board.logdir).alive()
        assert not TensorBoardTask(transport, "pc-1", "x").alive()
        listening = transport.run("pc-1", "ss -ltn").stdout
        assert f":{board.remote_port} " not in listening
