"""Parameter servers reached over torch.distributed.rpc."""
