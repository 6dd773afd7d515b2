"""Triton Inference Server: its model configuration read into policy settings."""
