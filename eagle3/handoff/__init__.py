"""The GPU handoff between phases, in one room: `core` (run_handoff, the recovery handoff, the
report), and what it uses: `holders` (who holds a GPU, a device file or a port, ours or foreign),
`gpus` (NVML readings), `shm` (the /dev/shm purge), `pycache` (stale bytecode), `systemd` (units a
config names) and `view` (the report as a line, text or markdown). It builds on eagle3.process
(supervised services, /proc, ending process groups); eagle3.process imports nothing of it but,
lazily and only on GPU nodes, the NVML memory sample its hang watchdog reads (`gpus`)."""
