"""schedsim: simulate batching and scheduling policies for GPU inference serving.

Subpackages, each readable on its own:

- ``core``       the event core, the request-level and LLM simulation drivers, policy
                 interfaces, per-request results and their summaries
- ``cost``       measured cost tables (CSV + JSON provenance sidecar) and the cost models
- ``profiling``  measuring engines into cost tables
- ``live``       the live drivers (the same policies against real engines) and validation
- ``traces``     request traces: loading, generating, importing
- ``planning``   sweeps, capacity plans, fleets and autoscaling
- ``run``        what ``schedsim run`` does: runners, prediction bands, reports, plots
- ``triton``     a real Triton server as live engine and cost source
- ``cli``        the ``schedsim`` command (also ``python -m schedsim``)

Importing ``schedsim`` imports none of simpy, torch or any engine.
"""

__version__ = "0.1.0"
