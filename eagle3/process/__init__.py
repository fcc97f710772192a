"""The process layer: `services` (the one supervised-process implementation: launch, registry,
readiness, watchdog, stop), `terminate` (ending a process group by identity: PID plus start ticks),
`procfs` (what the kernel says about a process) and `lease` (one run per run dir and per GPU)."""
