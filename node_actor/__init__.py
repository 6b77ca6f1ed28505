"""The node level: one actor per Ray node owning its GPUs (monitoring, local placement via the core, launch, supervision), device backends, MPS, and the emulated GPU processes."""
