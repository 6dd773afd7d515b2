"""The event core and the two simulation drivers (request-level and LLM), the policy
interfaces, and the per-request result tables and their summaries."""
