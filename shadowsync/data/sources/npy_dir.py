"""A directory of `.npy` arrays (`shadowsync.data.arrays`): any feature counts, table sizes
and feature names declared in its features.json, multi-hot features, ids checked against
their tables."""

from __future__ import annotations

from shadowsync.data import arrays
from shadowsync.data.ctr_data import CtrData
from shadowsync.data.sources.base import first_rows


class ArraySource:
    name = "arrays"
    generated = False

    def claims(self, path: str, schema: str | None) -> bool:
        return arrays.is_array_dir(path)

    def resolve(self, path: str, schema: str | None) -> str:
        return path

    def feature_counts(self, path: str) -> tuple[int, int]:
        return arrays.shapes(path)

    def declared_table_rows(self, path: str) -> list[int | None] | None:
        return arrays.declared_table_rows(path)

    def sparse_features(self, path: str, num_tables: int) -> list[dict[str, object]]:
        """Names from features.json where it names every single-id column, else C1..CT."""
        specs = arrays.multi_hot_specs(path)
        single = num_tables - len(specs)
        named = (arrays.declared(path) or {}).get("categorical", [])
        singles: list[dict[str, object]] = [{"name": f"C{i + 1}"} for i in range(single)]
        if (isinstance(named, list) and len(named) == single
                and all(isinstance(c, dict) and isinstance(c.get("name"), str) for c in named)):
            # a bucketized feature's rule travels with it (`tabular.Sparse.bucket_ids`)
            singles = [{k: c[k] for k in ("name", "bucketize", "edges") if k in c}
                       for c in named]
        return [*({**s, "multi_hot": False} for s in singles),
                *({"name": s["name"], "multi_hot": True, "pooling": s["pooling"],
                   "weighted": s["weighted"]} for s in specs)]

    def open(self, path: str, *, examples: int | None, seed: int,
             skip_bad_lines: bool) -> CtrData:
        labels, dense, cats = arrays.load(path)
        return first_rows(CtrData(labels, dense, cats, source=path,
                                  multi_hot=arrays.load_multi_hot(path, len(labels))), examples)

    def check_ids(self, data: CtrData, table_rows: tuple[int, ...]) -> None:
        arrays.check_ids(data.source, data.cats, table_rows)
        arrays.check_bag_ids(data.source, data.multi_hot, table_rows[data.cats.shape[1]:])
