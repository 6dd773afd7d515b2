"""Triton Inference Server: its model configuration read and written, a real server started and driven."""
