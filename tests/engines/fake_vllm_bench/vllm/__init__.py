"""A stand-in for vLLM's benchmark client (vllm.benchmarks.serve), for the load-generator driver's
tests: it cannot tell real servers apart anyway; the real client runs in the slow bench tests."""
