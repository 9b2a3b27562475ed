"""Experiments of the paper built on the shared training loop (LRA, fine-tuning, ...)."""
