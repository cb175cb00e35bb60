"""A LightGBM baseline for `bench realdata`: gradient-boosted trees on the same rows.

LightGBM (Ke et al., NeurIPS 2017) is what a tabular data set is usually first tried with.
Its inputs here are the ones every learner of the bench sees: the dense features as numbers,
each single-id feature as one of LightGBM's categorical features (split by id sets, not by id
order), and each multi-hot feature as one 0/1 column per id (a sparse matrix). A feature
bucketized from a number (`data prepare`'s NAME_quantile) is left out: it says nothing the
number does not, a tree splits the number at any threshold itself, and read as a categorical
of dozens of levels it cost the trees AUC (0.927 -> 0.924 on the census set). It trains on
the first 1 - val_share of the training rows, stops adding trees when the log loss of the
validation tail has not improved for `patience` rounds, and reports the best round's model
on the eval rows, with the validation tail's AUC at that round (what `bench realdata` picks a
setting of its grid by). Needs the `bench` extra (pip install 'shadowsync[bench]').
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from shadowsync.bench.deepfm import Rows, split_rows
from shadowsync.errors import UserError
from shadowsync.metrics import evaluate_predictions


@dataclass
class GbdtConfig:
    learning_rate: float = 0.05
    num_leaves: int = 31
    min_data_in_leaf: int = 20  # LightGBM's min_child_samples
    max_rounds: int = 3000
    patience: int = 100


def features_of(rows: Rows) -> Any:
    """The rows as one matrix: dense, single-id (but those bucketized from a dense feature),
    then one column per multi-hot id (sparse when there are multi-hot features)."""
    from scipy import sparse

    single = np.hstack([rows.dense.numpy().astype(np.float64),
                        rows.cats.numpy()[:, _ids_kept(rows)].astype(np.float64)])
    if not rows.bags:
        return single
    blocks = [sparse.csr_matrix(single)]
    for (values, offsets, _), size in zip(rows.bags, rows.table_sizes[rows.cats.shape[1]:],
                                          strict=True):
        data = np.ones(len(values))
        blocks.append(sparse.csr_matrix((data, values.numpy(), offsets.numpy()),
                                        shape=(len(rows), size)))
    return sparse.hstack(blocks, format="csr")


def _ids_kept(rows: Rows) -> list[int]:
    """The single-id columns LightGBM reads: all but those bucketized from a number."""
    return [j for j in range(rows.cats.shape[1]) if j not in rows.bucketized]


def train_gbdt(train_dir: str, eval_dir: str, val_share: float, seed: int,
               cfg: GbdtConfig | None = None, threads: int = 1) -> dict[str, Any]:
    """Train on the first 1 - val_share of the training rows, stop on the rest, report the
    best round's model on `eval_dir`."""
    try:
        import lightgbm as lgb
    except ImportError:
        raise UserError("bench realdata: the LightGBM baseline needs lightgbm: pip install "
                        "'shadowsync[bench]'") from None
    cfg = cfg or GbdtConfig()
    t0 = time.perf_counter()
    rows, train, val, test = split_rows(train_dir, eval_dir, val_share)
    categorical = list(range(rows.dense.shape[1], rows.dense.shape[1] + len(_ids_kept(rows))))
    params = {"objective": "binary", "metric": "binary_logloss",
              "learning_rate": cfg.learning_rate, "num_leaves": cfg.num_leaves,
              "min_data_in_leaf": cfg.min_data_in_leaf, "num_threads": threads, "seed": seed,
              "deterministic": True, "verbosity": -1}
    train_set = lgb.Dataset(features_of(train), train.labels.numpy(),
                            categorical_feature=categorical, free_raw_data=False)
    val_set = lgb.Dataset(features_of(val), val.labels.numpy(), reference=train_set)
    booster = lgb.train(params, train_set, cfg.max_rounds, valid_sets=[val_set],
                        callbacks=[lgb.early_stopping(cfg.patience, verbose=False)])
    def scored(rows: Rows) -> dict[str, float]:
        p = booster.predict(features_of(rows), num_iteration=booster.best_iteration)
        return evaluate_predictions(p, rows.labels.numpy())

    final = scored(test)
    return {"eval_auc": final["auc"], "eval_ne": final["ne"], "eval_logloss": final["logloss"],
            "val_auc": scored(val)["auc"], "best_round": booster.best_iteration,
            "wall_s": time.perf_counter() - t0}
