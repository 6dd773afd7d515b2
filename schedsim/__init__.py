"""schedsim: simulate batching and scheduling policies for GPU inference serving.

The package is split so that each piece can be read on its own:

- ``trace``      request traces (columnar), loaders and importers
- ``profile``    measured cost tables (CSV + JSON provenance sidecar)
- ``cost``       the cost model: how long a batch takes
- ``policy``     the interface every batching policy implements (pure decisions)
- ``events``     event priorities: completions before arrivals before decisions
- ``simulate``   the simpy driver that turns decisions into timeouts
- ``live``       the live driver: the same policies against a real engine, in real time
- ``results``    the per-request table both drivers produce (no simpy)
- ``metrics``    summaries computed from the per-request table
- ``validate``   predicted against measured
- ``profiler``   measuring engines into profiles (``engines/`` holds the backends)
- ``cli``        the ``schedsim`` command

Importing ``schedsim`` imports none of simpy, torch or any engine.
"""

__version__ = "0.1.0"
