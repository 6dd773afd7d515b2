"""Measuring real engines into cost tables: the calibration harness, the LLM step profiler,
timing helpers and CPU pinning."""
