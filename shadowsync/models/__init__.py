"""Models: the dense part of DLRM (embedding tables live in shadowsync.embeddings)."""

from shadowsync.models.dlrm import DLRMDense, ModelConfig

__all__ = ["DLRMDense", "ModelConfig"]
