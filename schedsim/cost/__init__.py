"""Cost models: measured profiles, how long a batch or an LLM step takes, and the host and
GPU effects that change it (power cap, wake-up, model shapes and KV budgets)."""
