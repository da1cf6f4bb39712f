"""What gce's nodes cost: the dated list-price table (``table.py``: Google's
public on-demand prices for us-central1) and the estimates built on it
(``estimates.py``: the nodes as they are, for ``status``, and what ``up``
would create), gce's side of the optional ``Pricing`` protocol
(infra/providers/base.py). No other provider prices its nodes.

Imports the provider base and gce's own modules; never the Compute API.
"""
