"""The command line's side of tfcluster: how ``deploy.py`` shows things.

``deploy.py`` makes the command group; its commands (parse, call
``infra``, render) are in ``commands/``, a module per group; what they
render with is here, one concept a module: the consoles (consoles.py), the
error printer and the debug log (errors.py), the command group that turns
errors into one line and an exit code (group.py), the options several
commands share (options.py), the process itself: version, signals,
arguments (program.py), tables and plain lines of data (render.py),
``report``'s comparisons (reports.py), the live views of a running job,
sweep, ``exec`` or ``logs`` (progress_view.py), and a sweep run with its
table (sweeps.py). ``infra/`` never imports this package: the library
prints nothing.
"""
