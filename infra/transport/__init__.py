"""How commands reach the nodes: the ``Transport`` seam (``base.py``), running
one function over many nodes (``fanout.py``), and its SSH side: the transport
(``ssh.py``), connections (``ssh_connections.py``), streamed output
(``ssh_stream.py``), the system ssh's command line for rsync and a
user's shell (``system_ssh.py``), pinned host keys (``host_keys.py``), and bringing a
node's folder here without trusting the node (``fetch.py``).

Knows nothing of jobs or providers: imports config and state only.
"""
