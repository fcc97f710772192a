"""Engine adapters: how each engine is launched, probed, measured, and what checkpoints it loads."""
