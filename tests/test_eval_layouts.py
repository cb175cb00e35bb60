"""Every layout a run's model can have in a checkpoint evaluates, loads and exports alike.

Each layout trains a short real run; then `shadowsync eval` must reproduce the run's own final
eval NE on the same held-out rows, `shadowsync.load(...).predict(...)` its predictions, and
the exported program, loaded in a Python where shadowsync cannot be imported, the same
probabilities again. A rewrite of the embedding, dense-server or checkpoint path that changes
where a table's rows are saved fails here.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import numpy as np
import pytest

from tests.helpers import EASGD_JOB, LOCAL_JOB, SWITCH_JOB, run_cli, run_python, summary

TINY = ["--examples", "6000", "--batch-size", "256", "--workers", "1", "--eval-points", "0",
        "--no-progress", "-q"]
# 26 tables, every other one above the row-split limit: split and whole tables side by side.
MIXED_SIZES = ",".join(["500", "200"] * 13)

# Each layout's whole `shadowsync train` arguments. Three are jobs other modules check other
# things of (conftest's `trained` runs each once a session).
LAYOUTS = {
    "local-tables": LOCAL_JOB,  # test_recovery: bad inputs around its checkpoint
    # with the DLRM's top MLP reading the embeddings too (a wider first layer)
    "one-embedding-server": [*TINY, "--trainers", "1", "--embedding-servers", "1",
                             "--sync", "none", "--table-size", "500",
                             "--interaction", "dot+cat"],
    "row-split-over-two-servers": [*TINY, "--trainers", "2", "--embedding-servers", "2",
                                   "--row-split-limit", "300", "--table-size", MIXED_SIZES,
                                   "--sync", "s-ma"],
    "bsp": [*TINY, "--trainers", "2", "--sync", "bsp", "--table-size", "500"],
    "asp-two-dense-servers": [*TINY, "--trainers", "2", "--sync", "asp", "--dense-servers", "2",
                              "--table-size", "500"],
    "switch": SWITCH_JOB,  # test_protocol_cluster: the switch in place
    "s-easgd": EASGD_JOB,  # test_cluster: one of five background runs in a row
    "own-model": [*TINY, "--trainers", "2", "--sync", "s-bmuf",
                  "--model", "tests.helpers:two_layer_mlp", "--table-size", "500"],
}

EXPORTED: dict[str, tuple[Path, Path]] = {}  # layout -> (program, predictions), for the last test
RUNS: dict[str, Path] = {}  # layout -> its run directory


def held_out_rows(run: Path) -> tuple[np.ndarray, np.ndarray]:
    """The held-out rows `shadowsync eval --data synthetic` scores, as (dense, ids)."""
    from shadowsync.checkpoint.store import find_checkpoint, saved_config
    from shadowsync.data.dataset import batches
    from shadowsync.train.tasks import plan_data

    plan = plan_data(saved_config(find_checkpoint(run)))
    n = plan.eval_stop - plan.eval_start
    dense, ids, _ = next(batches(plan.eval, plan.eval_start, plan.eval_stop, n,
                                 table_size=list(plan.features.table_rows)))
    return dense.numpy(), ids.numpy()


@pytest.mark.timeout(150)
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_checkpoint_evaluates_loads_and_exports_as_the_run_scored_it(layout, trained,
                                                                      tmp_path_factory):
    import shadowsync
    from shadowsync.evaluation import evaluate_checkpoint

    tmp = tmp_path_factory.mktemp(layout)
    out, res = trained(LAYOUTS[layout], timeout=120)
    RUNS[layout] = out
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.leftover == []
    run = summary(out)

    pred_file = tmp / "pred.npy"
    got = evaluate_checkpoint(str(out), "synthetic", str(pred_file))
    assert got["examples"] == run["eval_examples"]
    assert got["ne"] == pytest.approx(run["eval_ne"], abs=1e-6)
    predictions = np.load(pred_file)

    model = shadowsync.load(out)
    dense, ids = held_out_rows(out)
    mine = model.predict(dense, ids, batch_size=1000).numpy()
    assert mine.shape == predictions.shape
    assert np.abs(mine - predictions).max() <= 1e-6

    program = tmp / "model.pt2"
    shadowsync.export(out, program)
    schema = json.loads(Path(str(program) + ".schema.json").read_text())
    assert [f["rows"] for f in schema["features"]] == model.table_rows.tolist()
    assert schema["dense_width"] == dense.shape[1]
    np.save(tmp / "dense.npy", dense)
    np.save(tmp / "ids.npy", ids)
    EXPORTED[layout] = (program, pred_file)


def test_the_cli_evaluates_and_exports_the_default_layout(tmp_path):
    if "one-embedding-server" not in EXPORTED:
        pytest.skip("the one-embedding-server layout did not run")
    program, predictions = EXPORTED["one-embedding-server"]
    run = RUNS["one-embedding-server"]
    res = run_cli(["eval", "--checkpoint", str(run), "--data", "synthetic",
                   "--predictions", str(tmp_path / "p.npy")], timeout=90)
    assert res.returncode == 0, res.stderr
    ne = float(next(ln.split()[1] for ln in res.stdout.splitlines() if ln.split()[0] == "ne"))
    assert ne == pytest.approx(summary(run)["eval_ne"], abs=1e-4)  # printed to 4 places
    assert np.array_equal(np.load(tmp_path / "p.npy"), np.load(predictions))

    out = program.parent / "cli.pt2"
    res = run_cli(["export", "--checkpoint", str(run), "--out", str(out)], timeout=90)
    assert res.returncode == 0, res.stderr
    assert out.is_file() and Path(str(out) + ".schema.json").is_file()
    EXPORTED["cli-export"] = (out, predictions)  # checked with torch alone below

    res = run_cli(["export", "--checkpoint", str(run), "--out", str(tmp_path / "m.onnx")], 60)
    assert res.returncode == 2 and res.stderr.count("\n") == 1, res.stderr
    assert "an exported program is a .pt2 file" in res.stderr


# Run with -I (no user site, no PYTHONPATH, no current directory on the path) and a finder that
# refuses shadowsync, which an editable install would otherwise still put on the path.
TORCH_ONLY = """
import importlib.abc, sys

class NoShadowsync(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "shadowsync":
            raise ImportError("shadowsync is not installed here")

sys.meta_path.insert(0, NoShadowsync())
try:
    import shadowsync  # noqa: F401
    raise SystemExit("shadowsync could be imported")
except ImportError:
    pass
import json
import numpy as np
import torch

worst = {}
for layout, (program, predictions) in json.loads(sys.argv[1]).items():
    folder = program.rsplit("/", 1)[0]  # the layout's rows were saved beside its program
    model = torch.export.load(program).module()
    with torch.no_grad():
        logits = model(torch.from_numpy(np.load(folder + "/dense.npy")),
                       torch.from_numpy(np.load(folder + "/ids.npy")))
    worst[layout] = float(np.abs(torch.sigmoid(logits).numpy() - np.load(predictions)).max())
assert not any(m.startswith("shadowsync") for m in sys.modules)
print(json.dumps(worst))
"""


@pytest.mark.timeout(120)
def test_exported_programs_predict_the_same_with_torch_alone(tmp_path):
    if not EXPORTED:
        pytest.skip("no layout was exported")
    files = {k: (str(p), str(q)) for k, (p, q) in EXPORTED.items()}
    res = run_python(["-I", "-c", textwrap.dedent(TORCH_ONLY), json.dumps(files)], timeout=100,
                     cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    worst = json.loads(res.stdout)
    assert set(worst) == set(EXPORTED)
    assert all(v <= 1e-6 for v in worst.values()), worst


@pytest.mark.timeout(150)
def test_a_run_on_arrays_loads_after_its_data_is_gone(tmp_path):
    import shutil

    import shadowsync
    from tests.conftest import write_array_dir

    data = write_array_dir(tmp_path / "arrays", rows=8_000, num_dense=5, num_tables=3)
    out = tmp_path / "run"
    res = run_cli(["train", *TINY, "--data", str(data), "--trainers", "1",
                   "--embedding-servers", "0", "--sync", "none", "--table-size", "50,60,70",
                   "--out", str(out)], timeout=120)
    assert res.returncode == 0, res.stderr[-3000:]
    dense = np.load(data / "dense.npy")[:100]
    ids = np.load(data / "cats.npy")[:100]
    before = shadowsync.load(out).predict(dense, ids)
    shutil.rmtree(data)  # the model ships without its data: the manifest has its shape
    model = shadowsync.load(out)
    assert model.num_dense == 5 and model.table_rows.tolist() == [50, 60, 70]
    assert np.array_equal(model.predict(dense, ids).numpy(), before.numpy())
