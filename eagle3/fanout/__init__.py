"""Phases fanned out over several nodes (docs/fanout.md). A shard is the phase itself, run on one
node over a deterministic, disjoint slice of its input, in a run dir of its own under
`<run_dir>/shards/`; the phase's row merges the shards into its ordinary output.

  slices.py   which slice a shard gets (by position in the id-ordered input, as speculators does)
  node.py     what a node contributes: its identity, its port offset, the shard's config and inputs
  shard.py    one shard run on its node: leases, heartbeat, handoffs, the phase
  ledger.py   the coordinator's record of a phase's shards and its earlier runs (`eagle3 status`)
  workers.py  whether a pool can start a shard: no worker, a lost one (the pack's bound), busy, or idle

The coordinator that submits shards to the pools is Prefect's part (tasks/fanout.py); nothing here
imports Prefect."""
