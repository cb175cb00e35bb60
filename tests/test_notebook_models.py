"""Models written in a notebook cell or a script: the factory and the model's class travel to
every process by value (cloudpickle), and what cannot travel at all fails in one line."""

from __future__ import annotations

import json
import pickle
import textwrap
import threading

import pytest

from shadowsync.by_value import ByValue, portable
from shadowsync.errors import UserError
from shadowsync.toml_file import read_toml
from tests.helpers import run_python


def _factory_with_a_local_class(scale: float):
    import torch
    from torch import nn

    def build(num_dense, num_tables, dim):
        class Local(nn.Module):
            def __init__(self):
                super().__init__()
                self.net = nn.Linear(num_dense + num_tables * dim, 1)

            def forward(self, dense, emb):
                return scale * self.net(torch.cat([dense, emb.flatten(1)], 1)).squeeze(1)

        return Local()

    return build


def test_a_local_factory_and_its_class_round_trip_by_value():
    import torch

    build = portable(_factory_with_a_local_class(2.0))
    assert isinstance(build, ByValue)
    assert f"{build.__module__}:{build.__qualname__}".endswith("_factory_with_a_local_class."
                                                               "<locals>.build")
    again = pickle.loads(pickle.dumps(build))
    model = again(3, 2, 4)
    assert model(torch.zeros(5, 3), torch.zeros(5, 2, 4)).shape == (5,)
    assert model.net.in_features == 3 + 2 * 4


def test_an_importable_factory_still_goes_by_name():
    from tests.helpers import two_layer_mlp

    assert portable(two_layer_mlp) is two_layer_mlp


def test_a_factory_that_cannot_travel_at_all_is_one_line():
    lock = threading.Lock()

    def build(num_dense, num_tables, dim):
        with lock:
            raise AssertionError("never called")

    with pytest.raises(UserError, match=r"model: .*build cannot be sent to other processes, "
                                        r"even by value \(cloudpickle: TypeError") as e:
        portable(build)
    assert "\n" not in str(e.value)


# What a notebook does: the class and the factory live in __main__, which has no file another
# process could import (python -c), and one class is defined inside the factory.
NOTEBOOK = """
import json, sys
import torch
from torch import nn
import shadowsync

class Cell(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(width, 16), nn.ReLU(), nn.Linear(16, 1))

    def forward(self, dense, emb):
        return self.net(torch.cat([dense, emb.flatten(1)], 1)).squeeze(1)

def build(num_dense, num_tables, dim):
    class Wrapped(nn.Module):  # defined inside the factory, as notebooks often do
        def __init__(self):
            super().__init__()
            self.cell = Cell(num_dense + num_tables * dim)

        def forward(self, dense, emb):
            return self.cell(dense, emb)

    return Wrapped()

result = shadowsync.train(model=build, trainers=2, sync="s-bmuf", embedding_servers=1,
                          examples=6000, batch_size=256, workers=1, table_size=500,
                          eval_points=0, out=sys.argv[1], progress=False, log_level="warning")
model = result.model()
rows = torch.zeros(3, 13), torch.zeros(3, 26, dtype=torch.long)
from shadowsync.evaluation import evaluate_checkpoint
again = evaluate_checkpoint(sys.argv[1], "synthetic", model=build)["ne"]
print(json.dumps({"eval_ne": result.summary["eval_ne"], "again": again,
                  "class": type(model.dense_model).__qualname__,
                  "predict": model.predict(*rows).tolist()}))
"""


@pytest.mark.timeout(150)
def test_a_model_defined_in_main_trains_over_two_trainers_with_s_bmuf(tmp_path):
    res = run_python(["-c", textwrap.dedent(NOTEBOOK), str(tmp_path / "run")], timeout=130,
                     cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.leftover == []
    got = json.loads(res.stdout.strip().splitlines()[-1])
    assert got["class"] == "build.<locals>.Wrapped"
    # The model that comes back is the one the run scored.
    assert got["again"] == pytest.approx(got["eval_ne"], abs=1e-6)
    assert len(got["predict"]) == 3 and all(0 < p < 1 for p in got["predict"])
    # The run's config names it as written; loading it elsewhere needs the factory again.
    from shadowsync.errors import UserError as Error
    from shadowsync.inference import load

    config = read_toml(str(tmp_path / "run" / "config.toml"), "config")
    assert config["model"]["name"] == "__main__:build"
    with pytest.raises(Error, match=r"pass the same factory: --model MODULE:FUNCTION \(eval, "
                       r"export\) or shadowsync.load\(path, model=FUNCTION\)"):
        load(tmp_path / "run")
