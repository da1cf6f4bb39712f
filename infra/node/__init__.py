"""The shell tfcluster runs on a node for a task, each command beside the
parser of what it prints: start, watch and stop tasks (``commands.py``,
parsed by ``facts.py``), what the machine has (its GPUs, driver and
image's TensorFlow: ``probes.py``), the wrapper and watchdog every task runs in
(``watchdog.py``), a task's environment file (``task_env.py``) and the
autostop watcher (``autostop_commands.py``).

Pure text in, text out: imports spec and transport's ``NodeLayout``.
"""
