"""Embedding parameter servers: model-parallel tables shared by every trainer.

Tables are placed whole on servers (table-wise sharding, greedily balancing rows), except a
table above `row_split_limit` rows, which is cut row-wise over every server (id % E picks the
server, id // E the row there). There is one copy of each row in the job: trainers look rows
up and push sparse gradients, and the server applies SGD or row-wise Adagrad in place, from
many RPC threads at once without locks (Hogwild on the server). Embeddings are never averaged.

- `plan`: where every (table, id) lives (`ShardingPlan`, `RowKeys`);
- `server`: a server process's tables, its RPC functions and its profile counters;
- `client`: `RemoteEmbeddings`, the `EmbeddingClient` a trainer and its workers use, through
  shared memory for servers on their host and RPC for the others.
"""

from shadowsync.transport.servers.embedding.client import RemoteEmbeddings
from shadowsync.transport.servers.embedding.plan import RowKeys, ShardingPlan
from shadowsync.transport.servers.embedding.server import release, serve

__all__ = ["RemoteEmbeddings", "RowKeys", "ShardingPlan", "release", "serve"]
