"""Cluster commands (placeholder)."""
cluster_commands = ()
