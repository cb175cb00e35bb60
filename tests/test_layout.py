"""Roles from ranks and the placement of embedding tables on servers."""

import pytest
import torch

from shadowsync.embeddings import EmbeddingTables
from shadowsync.transport.layout import ClusterLayout
from shadowsync.transport.servers.embedding.plan import ShardingPlan


def test_roles_by_rank():
    lay = ClusterLayout(embedding_servers=2, dense_servers=1, trainers=2, workers=3)
    assert [lay.role(r) for r in range(5)] == [
        ("embedding", 0), ("embedding", 1), ("dense", 0), ("trainer", 0), ("trainer", 1)]
    assert lay.rpc_world_size == 5 + 6
    assert lay.worker_rpc_rank(1, 2) == 10


@pytest.mark.parametrize("e,d,t,hosts", [(2, 0, 2, 2), (4, 0, 4, 4), (2, 2, 6, 2), (3, 3, 3, 3),
                                        (1, 1, 2, 1)])
def test_per_host_placement_gives_every_host_the_same_roles(e, d, t, hosts):
    """Host h of H (n = (E + D + T) / H ranks each, consecutive) runs embedding servers
    h E/H .. (h + 1) E/H - 1, then dense servers h D/H .., then trainers h T/H .., in that
    order; every role's rank is where `role` puts it."""
    lay = ClusterLayout(e, d, t, workers=1, hosts=hosts, placement="per-host")
    lay.check()
    n = lay.world_size // hosts
    expected = []
    for h in range(hosts):
        expected += [("embedding", h * e // hosts + i) for i in range(e // hosts)]
        expected += [("dense", h * d // hosts + i) for i in range(d // hosts)]
        expected += [("trainer", h * t // hosts + i) for i in range(t // hosts)]
    assert [lay.role(r) for r in range(lay.world_size)] == expected
    ranks = range(lay.world_size)
    assert [lay.host_of(r) for r in ranks] == [r // n for r in ranks]
    assert [lay.role(lay.embedding_rank(i)) for i in range(e)] == [("embedding", i)
                                                                   for i in range(e)]
    assert [lay.role(lay.dense_rank(i)) for i in range(d)] == [("dense", i) for i in range(d)]
    assert [lay.role(r) for r in lay.trainer_ranks] == [("trainer", i) for i in range(t)]
    # each trainer's host has an embedding server of its own
    for i in range(t):
        host = lay.host_of(lay.trainer_rank(i))
        assert any(lay.host_of(lay.embedding_rank(s)) == host for s in range(e))


def test_per_host_on_one_host_is_first_and_first_fills_the_first_host():
    one = ClusterLayout(2, 1, 3, workers=2, hosts=1, placement="per-host")
    first = ClusterLayout(2, 1, 3, workers=2, hosts=1)
    assert [one.role(r) for r in range(6)] == [first.role(r) for r in range(6)]
    # torchrun's 2 hosts of 2: the job, its embedding server beside trainer 0 only
    spread = ClusterLayout(1, 0, 3, workers=1, hosts=2)
    assert spread.describe() == "host 0: emb0=0 trainer0=1; host 1: trainer1=2 trainer2=3"
    assert ClusterLayout(2, 0, 2, 1, hosts=2, placement="per-host").describe() == (
        "host 0: emb0=0 trainer0=1; host 1: emb1=2 trainer1=3")
    uneven = ClusterLayout(1, 0, 2, 1, hosts=2)  # torchrun hosts of other sizes
    assert uneven.describe() == "all hosts: emb0=0 trainer0=1 trainer1=2"


@pytest.mark.parametrize("e,d,t,needle", [
    (1, 0, 2, "give --embedding-servers a multiple of 2 (got 1)"),
    (2, 0, 3, "--trainers 3 does not divide over them"),
    (2, 1, 2, "--dense-servers 1 does not divide over them"),
])
def test_a_placement_the_hosts_cannot_meet_is_one_line(e, d, t, needle):
    from shadowsync.errors import UserError

    with pytest.raises(UserError, match="per-host on 2 hosts") as err:
        ClusterLayout(e, d, t, 1, hosts=2, placement="per-host").check()
    assert needle in str(err.value) and "\n" not in str(err.value)


def test_torchrun_hosts_decide_the_layout(monkeypatch):
    """Under torchrun the hosts come from GROUP_WORLD_SIZE; per-host placement needs the same
    processes on every host, said in one line naming --nproc-per-node."""
    from shadowsync.cluster.parts import layout_of, resolve
    from shadowsync.config import TrainConfig
    from shadowsync.errors import UserError

    cfg = resolve(TrainConfig(embedding_servers=2, trainers=2, embedding_placement="per-host"))
    assert layout_of(cfg.cluster).hosts == 1
    monkeypatch.setenv("GROUP_WORLD_SIZE", "2")
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert layout_of(cfg.cluster).trainer_ranks == [1, 3]
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "3")
    with pytest.raises(UserError, match="needs torchrun --nproc-per-node 2 on every host"):
        layout_of(cfg.cluster)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    with pytest.raises(UserError, match="--trainers 3 does not divide"):
        resolve(TrainConfig(embedding_servers=2, trainers=3, embedding_placement="per-host"))


def test_sharding_covers_every_row_exactly_once():
    rows = (100, 50, 1000, 20, 7)
    plan = ShardingPlan(3, rows, row_split_limit=500)
    keys = plan.keys()
    starts = keys.starts.tolist()
    assert starts[0] == 0 and starts[-1] == sum(rows)
    seen = set()
    for t, n in enumerate(rows):
        ids = torch.zeros(n, len(rows), dtype=torch.long)
        ids[:, t] = torch.arange(n)
        for i, key in enumerate(keys.of(ids).view(n, -1)[:, t].tolist()):
            server = max(s for s in range(3) if starts[s] <= key)
            row = key - starts[server]
            assert 0 <= row < sum(plan.server_pieces(server))
            if t == 2:  # split: id % 3 picks the server, id // 3 the row in its piece
                assert server == i % 3
            seen.add(key)
    assert seen == set(range(sum(rows)))  # every server row taken by exactly one (table, id)
    # the big table is split over all servers, the others are whole
    assert sum(len(plan.server_pieces(s)) for s in range(3)) == 3 + 4


def test_row_wise_adagrad_sums_repeated_ids():
    t = EmbeddingTables([4], 2, optimizer="adagrad", lr=1.0, eps=0.0)
    t.weight.zero_()
    g = torch.tensor([[1.0, 1.0], [1.0, 1.0]])
    t.apply_rows(torch.tensor([2, 2]), g)
    # summed grad (2, 2): accumulator 4, step 2 / sqrt(4) = 1 per coordinate
    assert torch.allclose(t.weight[2], torch.tensor([-1.0, -1.0]))
    assert t.state[2].item() == 4.0
    assert t.weight[[0, 1, 3]].abs().sum() == 0


def test_row_wise_adagrad_starts_from_the_initial_accumulator():
    # From a = 0.25, a row's first step with gradient (1, 1) is lr * 1 / sqrt(0.25 + 1), where
    # from zero it would be a full lr; the second step's accumulator holds a + 1 + 1.
    t = EmbeddingTables([3], 2, optimizer="adagrad", lr=1.0, eps=0.0, initial_accumulator=0.25)
    assert t.state.tolist() == [0.25, 0.25, 0.25]
    t.weight.zero_()
    t.apply_rows(torch.tensor([1]), torch.ones(1, 2))
    first = -1.0 / 1.25 ** 0.5
    assert torch.allclose(t.weight[1], torch.full((2,), first))
    t.apply_rows(torch.tensor([1]), torch.ones(1, 2))
    assert torch.allclose(t.weight[1], torch.full((2,), first - 1.0 / 2.25 ** 0.5))
    assert t.state.tolist() == [0.25, 2.25, 0.25]


@pytest.mark.parametrize("optimizer", ["adagrad", "sgd"])
def test_a_schedules_factor_scales_the_step_not_the_accumulator(optimizer):
    # lr_scale s: a row's step is s * lr * g / sqrt(a + g^2) (Adagrad) or s * lr * g (SGD);
    # the accumulator takes g^2 whatever s is, as a dense optimizer's state does.
    t = EmbeddingTables([2], 2, optimizer=optimizer, lr=0.5, eps=0.0, initial_accumulator=0.25)
    t.weight.zero_()
    t.apply_rows(torch.tensor([0]), torch.full((1, 2), 2.0), lr_scale=0.3)
    per_coordinate = 2.0 / (0.25 + 4.0) ** 0.5 if optimizer == "adagrad" else 2.0
    assert torch.allclose(t.weight[0], torch.full((2,), -0.3 * 0.5 * per_coordinate))
    if optimizer == "adagrad":
        assert t.state.tolist() == [4.25, 0.25]


def test_sparse_sgd():
    t = EmbeddingTables([3, 2], 2, optimizer="sgd", lr=0.5)
    before = t.weight.clone()
    t.apply_gradients(torch.tensor([[1, 1]]), torch.ones(1, 2, 2))
    assert torch.allclose(t.weight[1], before[1] - 0.5)
    assert torch.allclose(t.weight[4], before[4] - 0.5)  # table 2 starts at row 3


def test_a_jobs_tables_start_from_its_initial_accumulator():
    from shadowsync.config import TrainConfig
    from shadowsync.train.local import local_tables
    from shadowsync.train.tasks import Features

    cfg = TrainConfig(embedding_initial_accumulator=0.3, embedding_lr=0.7)
    t = local_tables(cfg.model, cfg.optim, cfg.seed, Features(13, (5, 7)))
    assert torch.equal(t.state, torch.full((12,), 0.3))
    assert t.lr == 0.7
    default = TrainConfig().optim.embedding_initial_accumulator
    plain = TrainConfig()
    assert torch.equal(local_tables(plain.model, plain.optim, plain.seed,
                                    Features(13, (5,))).state, torch.full((5,), default))


def test_a_weight_decay_per_table_reaches_only_its_tables_rows():
    # SGD at lr: a row of a table with decay wd steps by -lr * (g + wd * w), one without by
    # -lr * g; rows of table 1 start at row 3.
    t = EmbeddingTables([3, 2], 2, optimizer="sgd", lr=0.5, weight_decay=[0.2, 0.0])
    t.weight.fill_(1.0)
    t.apply_rows(torch.tensor([2, 3]), torch.ones(2, 2))
    assert torch.allclose(t.weight[2], torch.full((2,), 1.0 - 0.5 * (1.0 + 0.2)))
    assert torch.allclose(t.weight[3], torch.full((2,), 1.0 - 0.5))
    assert t.weight[[0, 1, 4]].eq(1.0).all()
    with pytest.raises(ValueError, match="3 weight decays for 2 tables"):
        EmbeddingTables([3, 2], 2, weight_decay=[0.1, 0.1, 0.1])


def test_a_server_takes_the_weight_decay_of_the_tables_it_holds_pieces_of():
    from shadowsync.transport.servers.embedding.plan import ShardingPlan

    plan = ShardingPlan(2, (60, 300, 40), row_split_limit=100)
    rule = {"optimizer": "adagrad", "lr": 0.1, "initial_accumulator": [0.05, 0.0, 0.05],
            "weight_decay": [1e-3, 0.0, 2e-3]}
    for server in (0, 1):
        got = plan.server_optimizer(server, rule)
        tables = plan._placement()[3][server]
        assert got["weight_decay"] == [rule["weight_decay"][t] for t in tables]
        assert got["initial_accumulator"] == [rule["initial_accumulator"][t] for t in tables]
        assert len(got["weight_decay"]) == len(plan.server_pieces(server))
