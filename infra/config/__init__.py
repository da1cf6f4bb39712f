"""cluster.yaml, typed and strict: the sections (``schema.py``, built on
``base.py``'s ``Strict``; ``hosts.py`` for provider ssh; ``storage.py`` for
the bucket), loading and checking a file (``loader.py``), and the provider
registry that the file's ``provider`` key names (``providers.py``).

Imports ``infra.errors``, ``infra.storage.urls`` and the trainer's catalog,
never a provider's code: the registry holds "module:Class" text.
"""
