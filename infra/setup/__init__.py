"""Install and sync a node: what ``up`` does on every node once it runs, and
``train`` before a job (``nodes.py``). The venv and its fingerprint
(``install.py``, ``install_plan.py``), the checkout, data and working folder
(what goes: ``sync_items.py``, ``workdir.py``; how: ``sync.py``), the code
a job started with (``code_snapshot.py``); the commands (``commands.py``) beside the parsers of
their output (``facts.py``), and what setup did (``report.py``).

Imports providers and everything below them.
"""
