"""Embedding tables: model-parallel, updated sparsely, never averaged."""

from shadowsync.embeddings.tables import EmbeddingTables, SparseOptimizer

__all__ = ["EmbeddingTables", "SparseOptimizer"]
