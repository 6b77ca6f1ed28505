"""``hier-sched bench``: the measurements behind BENCHMARKS.md. ``cli.py`` holds every command; each
bench module (decide, dispatch, chaos, wal, queue, simulator, robustness, traces, gpu_model) is
imported only when its command runs."""
