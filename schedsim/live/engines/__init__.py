"""Engines that run real models for measurement and the live runner (optional dependencies)."""
