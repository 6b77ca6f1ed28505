"""The cluster level: the global job queue (a Ray actor) and what it decides at submit time."""
