"""bench dynamic's budget schemas: the fixed tables fold a feature into N rows, the dynamic
tables get N rows as that feature's budget (a schema's sizes override --table-size)."""

from shadowsync.bench.dynamic import _budget_schemas
from shadowsync.data.tabular import TableSchema

SCHEMA = """label = "label"
dense = ["age"]

[[categorical]]
name = "garment"
table_size = 1207

[[multi_hot]]
name = "words"
table_size = 13928
pooling = "mean"
"""


def test_budget_schemas_fold_or_budget_only_the_named_features(tmp_path):
    (tmp_path / "schema.toml").write_text(SCHEMA)
    assert _budget_schemas(tmp_path, ("words",), 2000) == [1207, 2000]
    hashed = TableSchema.load(str(tmp_path / "schema-hash2000.toml"))
    raw = TableSchema.load(str(tmp_path / "schema-raw2000.toml"))
    for schema in (hashed, raw):
        assert [c.table_size for c in schema.categorical] == [1207]
        assert [m.table_size for m in schema.multi_hot] == [2000]
    assert (hashed.multi_hot[0].hash, hashed.multi_hot[0].raw) == (True, False)
    assert (raw.multi_hot[0].hash, raw.multi_hot[0].raw) == (False, True)
    assert not (hashed.categorical[0].hash or raw.categorical[0].raw)


def test_eps_only_with_another_part_or_too_few_examples_is_one_line(capsys):
    from shadowsync.cli import main

    for argv, option in ((["--eps-only", "--clothing-only"], "--eps-only"),
                         (["--eps-only", "--eps-examples", "100"], "--eps-examples")):
        assert main(["bench", "dynamic", *argv]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and option in err, err
