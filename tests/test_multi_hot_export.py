"""A run on multi-hot features is used after training as a single-id run is: `shadowsync eval
--predictions`, `shadowsync.load(...).predict(...)` with the multi-hot features as a dict, and
the exported program (in a Python where shadowsync cannot be imported, its inputs taken in the
order its schema lists them) give the same probabilities, with local tables and with one
embedding server."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import numpy as np
import pytest

from tests.helpers import run_cli, run_python, summary
from tests.test_eval_layouts import TORCH_ONLY
from tests.test_multi_hot import ITEMS, write_multi_hot_dir

TINY = ["--batch-size", "256", "--workers", "1", "--eval-points", "0", "--no-progress", "-q",
        "--table-size", f"30,{ITEMS},10"]
LAYOUTS = {
    "local-tables": ["--trainers", "1", "--embedding-servers", "0", "--sync", "none"],
    "one-embedding-server": ["--trainers", "1", "--embedding-servers", "1", "--sync", "none"],
}
EXPORTED: dict[str, tuple[Path, Path]] = {}  # layout -> (program, eval's predictions)

# The torch-only script of tests/test_eval_layouts.py, fed every input the schema lists from
# the array directory's files written beside each program (sparse: cats.npy; a bag's lengths:
# the differences of NAME.offsets.npy).
FEED_BY_SCHEMA = TORCH_ONLY.replace(
    """        logits = model(torch.from_numpy(np.load(folder + "/dense.npy")),
                       torch.from_numpy(np.load(folder + "/ids.npy")))""",
    """        arrays = []
        for i in json.load(open(program + ".schema.json"))["inputs"]:
            stem, _, part = i["name"].rpartition(".")
            if part == "lengths":  # the bags' sizes: differences of the stored offsets
                arrays.append(np.diff(np.load(f"{folder}/{stem}.offsets.npy")))
            else:
                name = {"sparse": "cats"}.get(i["name"], i["name"])
                arrays.append(np.load(f"{folder}/{name}.npy"))
        logits = model(*(torch.from_numpy(a) for a in arrays))""")


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("multi-hot-data")
    return (write_multi_hot_dir(tmp / "train", rows=6_000, seed=0),
            write_multi_hot_dir(tmp / "held", rows=1_500, seed=1))


@pytest.mark.timeout(200)
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_multi_hot_checkpoint_loads_predicts_and_exports_as_eval_scores_it(
        layout, data, tmp_path_factory):
    import shadowsync
    from shadowsync.errors import UserError
    from shadowsync.evaluation import evaluate_checkpoint

    train, held = data
    tmp = tmp_path_factory.mktemp(layout)
    out = tmp / "run"
    res = run_cli(["train", "--data", str(train), *TINY, *LAYOUTS[layout], "--out", str(out)],
                  timeout=150)
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.leftover == []
    assert summary(out)["eval_auc"] > 0.6

    pred_file = tmp / "pred.npy"
    evaluate_checkpoint(str(out), str(held), str(pred_file))
    predictions = np.load(pred_file)

    model = shadowsync.load(out)
    assert model.feature_names == ["c0", "items", "tags"]
    assert [(f.multi_hot, f.pooling, f.weighted) for f in model.features] == [
        (False, "sum", False), (True, "sum", False), (True, "mean", True)]

    def arr(name):
        return np.load(held / f"{name}.npy")

    bags = {"items": (arr("items.values"), arr("items.offsets")),
            "tags": (arr("tags.values"), arr("tags.offsets"), arr("tags.weights"))}
    mine = model.predict(arr("dense"), arr("cats"), multi_hot=bags, batch_size=700).numpy()
    assert mine.shape == predictions.shape
    assert np.abs(mine - predictions).max() <= 1e-6

    program = tmp / "model.pt2"
    shadowsync.export(out, program)
    schema = json.loads(Path(str(program) + ".schema.json").read_text())
    assert [i["name"] for i in schema["inputs"]] == [
        "dense", "sparse", "items.values", "items.lengths", "tags.values", "tags.lengths",
        "tags.weights"]
    assert schema["features"][2] == {"name": "tags", "rows": 10, "multi_hot": True,
                                     "pooling": "mean", "weighted": True}
    # the same ids pooled another way are refused, from the model's own features
    spoiled = tmp / "spoiled"
    spoiled.mkdir()
    for f in held.iterdir():
        (spoiled / f.name).write_bytes(f.read_bytes())
    spec = json.loads((spoiled / "features.json").read_text())
    spec["multi_hot"][0]["pooling"] = "mean"
    (spoiled / "features.json").write_text(json.dumps(spec))
    with pytest.raises(UserError, match=r"items \(mean\), tags \(weighted mean\), but the "
                       r"checkpoint's model was trained on 1 single-id, items \(sum\)"):
        evaluate_checkpoint(str(out), str(spoiled))
    # one row (a batch of 1 and bags of its own size) through the program, here
    import torch

    first = [arr("dense")[:1], arr("cats")[:1]]
    for parts in bags.values():
        end = int(parts[1][1])
        first += [parts[0][:end], np.diff(parts[1][:2]), *(p[:end] for p in parts[2:])]
    with torch.no_grad():
        one = torch.sigmoid(torch.export.load(str(program)).module()(
            *(torch.from_numpy(np.ascontiguousarray(a)) for a in first)))
    assert abs(float(one[0]) - predictions[0]) <= 1e-6
    for f in held.glob("*.npy"):  # the held-out rows beside the program, for torch alone
        (tmp / f.name).write_bytes(f.read_bytes())
    EXPORTED[layout] = (program, pred_file)


@pytest.mark.timeout(120)
def test_exported_multi_hot_programs_predict_the_same_with_torch_alone(tmp_path):
    if not EXPORTED:
        pytest.skip("no layout was exported")
    assert FEED_BY_SCHEMA != TORCH_ONLY
    files = {k: (str(p), str(q)) for k, (p, q) in EXPORTED.items()}
    res = run_python(["-I", "-c", textwrap.dedent(FEED_BY_SCHEMA), json.dumps(files)],
                     timeout=100, cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    worst = json.loads(res.stdout)
    assert set(worst) == set(EXPORTED)
    assert all(v <= 1e-6 for v in worst.values()), worst
