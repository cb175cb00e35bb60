"""Bags of ids pooled into one vector per (example, feature): `shadowsync.data.bags`, where the
batches that carry them are made (data sits below the embeddings that pool them)."""

from shadowsync.data.bags import POOLINGS, Bags

__all__ = ["POOLINGS", "Bags"]
