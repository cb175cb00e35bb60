"""CTR data: Criteo TSV reading with a binary cache, ``.npy`` array directories with any
feature counts, planted-teacher synthetic data, batches.

- ``open_data(path)`` gives a ``CtrData`` for ``"synthetic"``, a directory of ``.npy`` arrays
  or a Criteo file/.gz/directory, read by the path's source (``shadowsync.data.sources``:
  one module per format and one registry entry);
- ``batches(data, start, stop, batch_size, shard, num_shards)`` cuts it into tensors;
- ``synth.write_tsv_dataset`` writes synthetic data as Criteo TSV with the teacher's NE.
"""

from shadowsync.data.dataset import CtrData, batches, num_batches, open_data
from shadowsync.data.synth import SynthConfig, SynthData, generate, write_tsv_dataset

__all__ = [
    "CtrData",
    "SynthConfig",
    "SynthData",
    "batches",
    "generate",
    "num_batches",
    "open_data",
    "write_tsv_dataset",
]
