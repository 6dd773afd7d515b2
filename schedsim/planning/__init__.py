"""Sizing questions answered with many runs: sweeps, capacity plans, fleets of replicas
behind routers, and autoscaling."""
