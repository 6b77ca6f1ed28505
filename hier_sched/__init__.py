"""hier_sched: collocation-aware, cluster-scale scheduling of deep-learning training jobs on Ray."""
