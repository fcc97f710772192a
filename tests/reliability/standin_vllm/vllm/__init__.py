"""The stand-in engine's answer to the pack's engine probe (eagle3/engine_side/inspect_vllm.py):
the few vLLM modules the probe imports, nothing else. STANDIN_VLLM_RELEASE picks which release's
server flags its parser has: "0.32" (default: with --enable-scale-out) or "0.25" (without)."""
