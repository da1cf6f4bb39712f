"""tfcluster's library: everything ``deploy.py`` does, without a command line.

Never imports click (tfcluster_cli/ and deploy.py are the command lines).
Its folders are its rooms, each a layer that imports only from the layers
below it (tests/test_architecture.py checks the order, lowest first):

* ``errors.py``, ``text.py``: the exception root, and text from nodes made safe;
* ``spec/``: what a job is, as data (its program, its tasks, TF_CONFIG);
* ``storage/``: Cloud Storage as the nodes use it (the uploader);
* ``config/``: cluster.yaml, typed and strict, and the provider registry;
* ``state/``: what this machine keeps per cluster (the folder, the lock, the key);
* ``transport/``: how commands reach the nodes (SSH, fan-out, fetch);
* ``node/``: the shell tfcluster runs on a node for a task, and what it prints;
* ``bucket/``: the cluster's bucket as this machine uses it;
* ``providers/``: where the nodes come from (gce, ssh, local);
* ``setup/``: install and sync a node;
* ``jobs/``: a job's life: start, watch, recover, fetch;
* ``cluster/``: ``Cluster``, the API behind every command, and the nodes' life;
* ``sweeps/``: many experiments at once;
* ``reports/``: runs compared.
"""
