"""The TensorFlow program every node of a tfcluster runs (``python -m trainer``).

Its folders are its rooms, each a layer that imports only from the layers
below it (tests/test_architecture.py checks the order, lowest first):

* ``errors.py``, ``options.py``, ``imports.py``: the exception root, a model's
  or mode's own options, TensorFlow's import;
* ``layers/``: the built-in models' layers in plain Python and how they are cut
  into stages (no TensorFlow: the catalog and the launcher read them);
* ``catalog.py``, ``flags.py``: the one list of models and modes, and the flags;
* ``data/``: MNIST, which examples each worker reads, the prefetch before the
  network goes away;
* ``models/``: the model modules (cnn, convnet, dae, sdae);
* ``loop/``: the training loop and its steps, the optimizer and its schedule,
  checkpoints, and what the chief writes (outputs, progress lines);
* ``distribution/``: the one strategy factory, collectives, accelerators;
* ``modes/``: the training modes, one module each (and ``--mode layers``'
  placement and pipelined step);
* ``training.py``, ``run.py``, ``__main__.py``: one training run, what this
  process does (serve or train), the command line.

Never imports infra/ or click: the nodes get this folder alone.
"""
