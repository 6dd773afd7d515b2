"""LLM serving: iteration-level (continuous) batching and paged KV caches.

The request-level simulator batches whole requests; an LLM engine runs *steps*
(iterations), each a forward pass over a few tokens of many requests. This package
holds what is specific to that world:

- :mod:`~schedsim.llm.step`: the :class:`Step` a policy decides and the hooks of an LLM policy;
- :mod:`~schedsim.llm.shapes`: how an engine pads a step (CUDA-graph sizes), shared by the
  live engine and the cost model so both price the same shapes;
- :mod:`~schedsim.llm.spec`: model specs (KV bytes per token, weights) and GPU block budgets;
- :mod:`~schedsim.llm.cost`: the step cost model fitted to a measured step profile;
- :mod:`~schedsim.llm.simulate`: the simpy driver for LLM policies;
- :mod:`~schedsim.llm.metrics`: TTFT, TPOT, ITL, E2E, goodput, token throughput.

The policies themselves live in :mod:`policies` (``continuous``, ``paged-kv``, LLM ``static``).
"""
