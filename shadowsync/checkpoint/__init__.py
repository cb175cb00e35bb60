"""Checkpoints: what a run saves, where, and how it is read back (see `store`)."""
