"""shadowsync: distributed training of recommendation models with pluggable synchronization."""

__version__ = "0.1.0"
