"""What this machine keeps per cluster: the state folder (``folder.py``: a
cache, never the truth), the lock that lets one command at a time change a
cluster (``lock.py``), and the cluster's SSH key pair (``keys.py``).

Imports config and spec only.
"""
