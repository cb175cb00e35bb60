"""Embedding tables: model-parallel, updated sparsely, never averaged."""

from shadowsync.embeddings.client import EmbeddingClient
from shadowsync.embeddings.tables import EmbeddingTables, SparseOptimizer

__all__ = ["EmbeddingClient", "EmbeddingTables", "SparseOptimizer"]
