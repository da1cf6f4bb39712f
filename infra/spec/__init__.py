"""What a job is, as data: the program every task runs and the record kept of
a job (``job.py``), its tasks and the one TF_CONFIG builder (``tfconfig.py``).

No I/O. Imports only ``infra.errors``/``infra.text`` and the trainer's
catalog: everything above describes jobs with these types.
"""
