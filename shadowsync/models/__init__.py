"""Models: the dense part of DLRM, or the user's own (embedding tables live in
shadowsync.embeddings)."""

from shadowsync.models.build import build_model
from shadowsync.models.dlrm import DLRMDense, ModelConfig

__all__ = ["DLRMDense", "ModelConfig", "build_model"]
