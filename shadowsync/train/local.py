"""A run on this machine with one trainer whose embedding tables live in shared memory."""

from __future__ import annotations

from shadowsync.config import ModelConfig, OptimConfig, RunRecord
from shadowsync.embeddings import EmbeddingTables
from shadowsync.embeddings.dynamic_tables import DynamicTables
from shadowsync.train.replica import ReplicaOptions, build_replica, run_replica
from shadowsync.train.table_kinds.kind import table_builder
from shadowsync.train.tasks import DataPlan, Features, build_dense_model, task_of


def local_tables(model: ModelConfig, optim: OptimConfig, seed: int,
                 features: Features) -> EmbeddingTables | DynamicTables:
    """The one trainer's tables, in shared memory for its workers (seeded by `seed`), as
    the run's --tables kind makes them."""
    return table_builder(model).local_tables(model, optim, seed, features)


def train_local(inputs: ReplicaOptions, plan: DataPlan, recorded: RunRecord
                ) -> dict[str, object]:
    """Train in this process (its Hogwild workers are child processes); --out exists.
    The parts, in order: the data (`plan`, opened by the caller), the dense model, the
    tables (local, in shared memory), no sync runner, the checkpointer, the trainer. What the
    run records of its options comes made, as `build_replica` takes it (`recorded`)."""
    # The workers are forked from a server that is likely still importing torch (it started
    # with this process): meanwhile, import what the evaluations need, which would otherwise
    # wait until the first evaluation (after training, with --eval-points 0).
    task_of(inputs.task).prepare_evaluation()
    if inputs.data.val_share > 0:  # best models are saved while training (see roles.import_ahead)
        import torch.distributed.checkpoint  # noqa: F401  (start-up cost, see above)
    model = build_dense_model(inputs, plan.features)
    tables = local_tables(inputs.model, inputs.optim, inputs.seed, plan.features)
    replica = build_replica(inputs, plan, tables, model, None, recorded=recorded)
    summary = run_replica(replica)
    assert summary is not None  # the only trainer is trainer 0
    return summary
