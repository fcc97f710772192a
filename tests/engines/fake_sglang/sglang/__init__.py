"""A stand-in for SGLang's server, for readiness tests on machines without SGLang (or a GPU)."""
