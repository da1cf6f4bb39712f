"""Providers: where the nodes of a cluster come from (gce, ssh, local).

``NodeProvider`` (``base.py``) and its plug-ins: gce (``gce/``, the only
package that calls the Compute API), ssh (machines that already exist) and
local (processes on this machine, in a network namespace of their own:
``local_network.py``, ``netns_holder.py``). What differs between providers
is asked of the provider (its ``Capabilities`` and hooks), never of its
name. Which providers exist, by name, is the registry in
infra/config/providers.py, which the config reads.
"""
