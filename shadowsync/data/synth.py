"""Planted-teacher CTR data: Criteo-shaped examples whose true click probability is known.

A random DLRM-like *teacher* scores each example from five parts: a bias per categorical
id; a small MLP over the 13 log-transformed counts (the "dense vector"); dot products of
the dense vector with the embedding of every categorical id; dot products between the
embeddings of the features with the fewest ids; and a small ReLU top MLP over the dense
vector and all those dot products. Each part is standardized and weighted by the square
root of its ``share_*`` knob, so the knobs are the parts' shares of the score's variance.
The click probability is ``sigmoid(a * score + b)``, with ``b`` chosen so the mean click
rate is ``target_ctr`` and ``a`` so the teacher's own normalized entropy (NE) is
``target_ne`` (in expectation). Labels are Bernoulli draws from that probability, so the
teacher's NE on the data is a floor no trained model can beat, and a model's quality is
its gap to that floor.

The data is meant to be learnable by a DLRM in about a minute: ids follow Zipf-like
frequencies, most of the variance sits in the parts a student learns fastest (id biases
and the dense MLP), and an id's signal fades past a rank (``signal_ranks`` for its bias,
``embedding_signal_ranks`` for its embedding), so the rare ids a student sees a handful of
times carry little. Embedding-by-embedding dot products, the slowest part to learn, only
involve low-cardinality features.

Hash values: id ``k`` of feature ``f`` is written as ``salt_f * 100_000 + r_f[k]`` with
distinct residues ``r_f[k]`` in ``[1, 100_000)``, so one feature's ids never collide in a
table of 100_000 rows, and they print as 8 hex digits like Criteo's. A missing categorical
is an empty field (read back as 0, which no id uses). Dense counts are lognormal-ish, some
are missing (empty field) and I2 has a few negative values, as in Criteo; the teacher sees
exactly what the reader produces.

Rows are generated in fixed blocks with seeds derived from ``(seed, block)``, so
``generate(n, seed)`` is a prefix of ``generate(m, seed)`` for ``n < m``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from tqdm import tqdm

from shadowsync.data.schema import NUM_CAT, NUM_DENSE, log_transform
from shadowsync.metrics.ctr import binary_entropy, normalized_entropy

# Part of every synthetic cache's name: bump it whenever the rows for a seed change.
SYNTH_VERSION = 1
BLOCK_ROWS = 65_536
HASH_MODULUS = 100_000
MAX_COUNT = 999_999_999

_CALIBRATION_ROWS = 2 * BLOCK_ROWS
_HEX_CHARS = np.frombuffer(b"0123456789abcdef", np.uint8)


@dataclass(frozen=True)
class SynthConfig:
    """Knobs of the teacher; the defaults give CTR ~0.25 and teacher NE ~0.80."""

    # Ids per categorical feature, spread geometrically from vocab_min to vocab_max.
    vocab_min: int = 10
    vocab_max: int = 20_000
    # Zipf-like exponent of id frequencies, drawn per feature in [zipf_min, zipf_max].
    zipf_min: float = 1.1
    zipf_max: float = 1.2
    embedding_dim: int = 4
    hidden: int = 16  # width of the teacher's bottom and top MLPs
    interacting_features: int = 8  # features (fewest ids first) whose embeddings meet
    # An id's bias keeps full size up to this frequency rank, its embedding up to the next,
    # then both shrink like (rank_limit / rank) ** rare_decay.
    signal_ranks: int = 200
    embedding_signal_ranks: int = 30
    rare_decay: float = 1.0
    # Up to this fraction of a feature's values is missing (empty), for some features.
    cat_missing_max: float = 0.3
    dense_missing_max: float = 0.3
    target_ctr: float = 0.25
    target_ne: float = 0.80
    # Shares of the score's variance from each part of the teacher (normalized to sum 1):
    # per-id biases, the dense MLP alone, dense-vector x embedding dots, embedding x
    # embedding dots, and the nonlinear top MLP over all of those.
    share_ids: float = 0.55
    share_dense: float = 0.3
    share_dense_ids: float = 0.06
    share_pairs: float = 0.06
    share_top_mlp: float = 0.03

    def __post_init__(self) -> None:
        if not 1 <= self.vocab_min <= self.vocab_max < HASH_MODULUS:
            raise ValueError("need 1 <= vocab_min <= vocab_max < 100_000")
        if not 0 < self.target_ctr < 1 or not 0 < self.target_ne < 1:
            raise ValueError("target_ctr and target_ne must lie in (0, 1)")
        if not 2 <= self.interacting_features <= NUM_CAT:
            raise ValueError("interacting_features must be in [2, 26]")
        shares = (
            self.share_ids,
            self.share_dense,
            self.share_dense_ids,
            self.share_pairs,
            self.share_top_mlp,
        )
        if min(shares) < 0 or sum(shares) <= 0:
            raise ValueError("share_* knobs must be non-negative and not all zero")


def _ne(logloss: float, ctr: float) -> float | None:
    h = binary_entropy(ctr)
    return logloss / h if h > 0 else None


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * x))


@dataclass
class SynthData:
    """Generated examples: arrays as the reader produces them, plus the teacher's truth."""

    labels: np.ndarray  # float32 [n]
    dense: np.ndarray  # float32 [n, 13], log-transformed
    cats: np.ndarray  # int64 [n, 26], hash values (0 = missing)
    probs: np.ndarray  # float32 [n], the teacher's click probability
    dense_raw: np.ndarray  # int64 [n, 13], counts as written (may be negative)
    dense_missing: np.ndarray  # bool [n, 13], written as an empty field

    def __len__(self) -> int:
        return len(self.labels)

    @property
    def mean_ctr(self) -> float:
        return float(np.mean(self.labels, dtype=np.float64))

    def teacher_ne(self, start: int = 0, stop: int | None = None) -> float:
        return normalized_entropy(self.probs[start:stop], self.labels[start:stop])


class Teacher:
    """The random model that defines click probabilities; built from ``seed`` alone."""

    def __init__(self, seed: int, config: SynthConfig | None = None) -> None:
        self.seed = seed
        self.config = cfg = config or SynthConfig()
        rng = np.random.default_rng(np.random.SeedSequence([seed, 0]))
        d, h = cfg.embedding_dim, cfg.hidden

        vocab = np.geomspace(cfg.vocab_min, cfg.vocab_max, NUM_CAT).round().astype(np.int64)
        self.vocab = rng.permutation(vocab)
        self.zipf = rng.uniform(cfg.zipf_min, cfg.zipf_max, NUM_CAT)
        self.cat_missing = rng.uniform(0, cfg.cat_missing_max, NUM_CAT) * (
            rng.random(NUM_CAT) < 0.4
        )
        # Salts keep every value within 8 hex digits, at or above 0x10000000.
        salts = rng.choice(
            np.arange(0x10000000 // HASH_MODULUS + 1, 2**32 // HASH_MODULUS), NUM_CAT, replace=False
        )
        residues = np.arange(1, HASH_MODULUS)
        # Rank V_f of each feature is "missing", hash value 0.
        self.hash_values = [
            np.append(
                salts[f] * HASH_MODULUS + rng.choice(residues, self.vocab[f], replace=False), 0
            ).astype(np.int64)
            for f in range(NUM_CAT)
        ]
        self.offsets = np.concatenate([[0], np.cumsum(self.vocab + 1)[:-1]]).astype(np.int32)

        self.dense_mu = rng.uniform(0.5, 4.0, NUM_DENSE)
        self.dense_sigma = rng.uniform(0.7, 1.8, NUM_DENSE)
        self.dense_shared = rng.uniform(0.2, 0.7, NUM_DENSE)
        self.dense_missing = rng.uniform(0, cfg.dense_missing_max, NUM_DENSE) * (
            rng.random(NUM_DENSE) < 0.6
        )

        # Ranks past which an id's signal fades: embeddings (d numbers to learn per id) fade
        # sooner than the per-id bias (one number per id).
        rank = np.concatenate([np.append(np.arange(v, dtype=np.float64), -1.0) for v in self.vocab])
        bias_scale = self._fade(rank, cfg.signal_ranks)
        emb_scale = self._fade(rank, cfg.embedding_signal_ranks)
        rows = len(rank)
        self.emb = (rng.standard_normal((rows, d)) * emb_scale[:, None]).astype(np.float32)
        self.id_bias = (rng.standard_normal(rows) * bias_scale).astype(np.float32)

        self.w_b1 = (rng.standard_normal((NUM_DENSE, h)) * np.sqrt(2.0 / NUM_DENSE)).astype(
            np.float32
        )
        self.b_b1 = (rng.standard_normal(h) * 0.1).astype(np.float32)
        self.w_b2 = (rng.standard_normal((h, d)) * np.sqrt(1.0 / h)).astype(np.float32)
        self.b_b2 = (rng.standard_normal(d) * 0.5).astype(np.float32)

        # Embedding x embedding signal is the slowest for a student to pick up; keeping it
        # among the features with the fewest ids gives each of their ids many examples.
        self.inter = np.sort(np.argsort(self.vocab, kind="stable")[: cfg.interacting_features])
        self.pairs = np.triu_indices(cfg.interacting_features, k=1)
        top_in = d + NUM_CAT + len(self.pairs[0])
        self.w_t1 = (rng.standard_normal((top_in, h)) * np.sqrt(2.0 / top_in)).astype(np.float32)
        self.b_t1 = (rng.standard_normal(h) * 0.1).astype(np.float32)
        self.w_t2 = (rng.standard_normal(h) * np.sqrt(1.0 / h)).astype(np.float32)
        self.w_dense = rng.standard_normal(d).astype(np.float32)
        self.w_first = rng.standard_normal(NUM_CAT).astype(np.float32)
        self.w_pairs = rng.standard_normal(len(self.pairs[0])).astype(np.float32)
        shares = np.array(
            [
                cfg.share_ids,
                cfg.share_dense,
                cfg.share_dense_ids,
                cfg.share_pairs,
                cfg.share_top_mlp,
            ]
        )
        self.shares = shares / shares.sum()
        self.part_mean = np.zeros(len(shares))
        self.part_std = np.ones(len(shares))

        self.dense_mean = np.zeros(NUM_DENSE, np.float32)
        self.dense_std = np.ones(NUM_DENSE, np.float32)
        self.score_mean, self.score_std, self.a, self.b = 0.0, 1.0, 1.0, 0.0
        self._calibrate()

    # -- sampling -----------------------------------------------------------------------

    def _fade(self, rank: np.ndarray, start: int) -> np.ndarray:
        """1 up to rank ``start``, then falling like ``(start / rank) ** rare_decay``.

        Rank -1 marks the "missing" row, which is frequent and keeps full signal.
        """
        g = np.minimum(1.0, start / np.maximum(rank + 1.0, 1.0)) ** self.config.rare_decay
        g[rank < 0] = 1.0
        return g

    def sample_features(
        self, rng: np.random.Generator, n: int
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(ranks [n,26] with vocab_f meaning missing, raw counts [n,13], missing [n,13])."""
        u = rng.random((n, NUM_CAT), dtype=np.float32)
        missing_rate = self.cat_missing.astype(np.float32)
        miss = u < missing_rate
        # Reuse the uniform: above the missing rate it is again uniform on [0, 1).
        u = (u - missing_rate) / (1.0 - missing_rate).astype(np.float32)
        # Inverse CDF of a density proportional to (x + 1)^-s on [0, V): Zipf-like ranks.
        one_minus_s = 1.0 - self.zipf
        top = ((self.vocab + 1.0) ** one_minus_s - 1.0).astype(np.float32)
        x = (1.0 + u * top) ** (1.0 / one_minus_s).astype(np.float32)
        ranks = np.minimum(x.astype(np.int32) - 1, (self.vocab - 1).astype(np.int32))
        np.maximum(ranks, 0, out=ranks)
        ranks = np.where(miss, self.vocab.astype(np.int32), ranks)

        z = rng.standard_normal((n, NUM_DENSE))
        shared = rng.standard_normal((n, 1))
        z = self.dense_shared * shared + np.sqrt(1.0 - self.dense_shared**2) * z
        raw = np.floor(np.expm1(np.minimum(self.dense_mu + self.dense_sigma * z, 20.0)))
        raw = np.clip(raw, 0, MAX_COUNT).astype(np.int64)
        extra = rng.random((n, NUM_DENSE + 1))
        missing = extra[:, :NUM_DENSE] < self.dense_missing
        # Criteo's I2 holds a few negative values; the reader turns them into 0.
        negative = extra[:, NUM_DENSE] < 0.03
        raw[negative, 1] = -1 - (raw[negative, 1] % 3)
        missing[negative, 1] = False
        return ranks, raw, missing

    def hash_ids(self, ranks: np.ndarray) -> np.ndarray:
        """Hash values (what the TSV holds) of ranks from ``sample_features``."""
        out = np.empty(ranks.shape, np.int64)
        for f in range(NUM_CAT):
            out[:, f] = self.hash_values[f][ranks[:, f]]
        return out

    # -- scoring ------------------------------------------------------------------------

    def parts(self, ranks: np.ndarray, dense: np.ndarray) -> np.ndarray:
        """The teacher's score parts [n, 5] (see the ``share_*`` knobs), before scaling."""
        z = (dense - self.dense_mean) / self.dense_std
        hid = np.maximum(z @ self.w_b1 + self.b_b1, 0.0)
        xd = hid @ self.w_b2 + self.b_b2  # [n, d]
        idx = ranks + self.offsets
        dim = self.emb.shape[1]
        # Gathering whole rows as single opaque items is several times faster than [idx].
        rows = self.emb.view(np.dtype((np.void, 4 * dim))).ravel()
        e = rows[idx].view(np.float32).reshape(*idx.shape, dim)  # [n, 26, d]
        first = np.einsum("nd,nfd->nf", xd, e)
        inter = np.ascontiguousarray(idx[:, self.inter])
        ei = rows[inter].view(np.float32).reshape(len(idx), -1, dim)
        gram = np.matmul(ei, ei.transpose(0, 2, 1))
        second = gram[:, self.pairs[0], self.pairs[1]]
        # The top MLP's input is [xd, first, second]; multiplying the parts separately
        # avoids building that wide matrix.
        w1, d = self.w_t1, dim
        pre = xd @ w1[:d] + first @ w1[d : d + NUM_CAT] + second @ w1[d + NUM_CAT :] + self.b_t1
        out = np.empty((len(idx), 5))
        out[:, 0] = self.id_bias[idx].sum(axis=1)
        out[:, 1] = xd @ self.w_dense
        out[:, 2] = first @ self.w_first
        out[:, 3] = second @ self.w_pairs
        out[:, 4] = np.maximum(pre, 0.0) @ self.w_t2
        return out

    def logit(self, ranks: np.ndarray, dense: np.ndarray) -> np.ndarray:
        return self.a * self._score(self.parts(ranks, dense)) + self.b

    def _score(self, parts: np.ndarray) -> np.ndarray:
        z = (parts - self.part_mean) / self.part_std
        s = z @ np.sqrt(self.shares)
        return (s - self.score_mean) / self.score_std

    def prob(self, ranks: np.ndarray, dense: np.ndarray) -> np.ndarray:
        return _sigmoid(self.logit(ranks, dense))

    def _calibrate(self) -> None:
        cfg = self.config
        rng = np.random.default_rng(np.random.SeedSequence([self.seed, 2]))
        ranks, raw, missing = self.sample_features(rng, _CALIBRATION_ROWS)
        dense = log_transform(np.where(missing, 0, raw))
        self.dense_mean = dense.mean(axis=0).astype(np.float32)
        self.dense_std = (dense.std(axis=0) + 1e-3).astype(np.float32)
        parts = self.parts(ranks, dense)
        self.part_mean = parts.mean(axis=0)
        self.part_std = parts.std(axis=0) + 1e-12
        s = self._score(parts)
        # Parts are correlated; rescale so the score itself has mean 0 and variance 1.
        self.score_mean, self.score_std = float(s.mean()), float(s.std() + 1e-12)
        s = self._score(parts)

        def bias_for(a: float) -> float:
            # Newton's method on mean(sigmoid(a*s + b)) = target_ctr, which is increasing in b.
            b = float(np.log(cfg.target_ctr / (1 - cfg.target_ctr)))
            for _ in range(30):
                p = _sigmoid(a * s + b)
                gap = float(p.mean()) - cfg.target_ctr
                if abs(gap) < 1e-9:
                    break
                b -= gap / max(float(np.mean(p * (1 - p))), 1e-6)
            return b

        def expected_ne(a: float) -> tuple[float, float]:
            # Labels are Bernoulli(p): the expected log loss is the mean entropy of p.
            b = bias_for(a)
            p = np.clip(_sigmoid(a * s + b), 1e-12, 1 - 1e-12)
            h = -(p * np.log(p) + (1 - p) * np.log1p(-p))
            return float(h.mean() / binary_entropy(float(p.mean()))), b

        # NE falls as the logit spreads out; bisect on the spread.
        lo, hi = 0.0, 20.0
        for _ in range(30):
            mid = 0.5 * (lo + hi)
            if expected_ne(mid)[0] > cfg.target_ne:
                lo = mid
            else:
                hi = mid
        self.a = 0.5 * (lo + hi)
        self.b = expected_ne(self.a)[1]

    def describe(self) -> dict:
        return {
            "config": asdict(self.config),
            "logit_scale": self.a,
            "logit_bias": self.b,
            "variance_shares": self.shares.tolist(),
            "vocab": self.vocab.tolist(),
            "interacting_features": self.inter.tolist(),
        }

    # -- generation ---------------------------------------------------------------------

    def block(self, index: int) -> SynthData:
        """Rows ``[index * BLOCK_ROWS, (index + 1) * BLOCK_ROWS)`` of the stream."""
        rng = np.random.default_rng(np.random.SeedSequence([self.seed, 1, index]))
        ranks, raw, missing = self.sample_features(rng, BLOCK_ROWS)
        dense = log_transform(np.where(missing, 0, raw))
        probs = self.prob(ranks, dense).astype(np.float32)
        labels = (rng.random(BLOCK_ROWS) < probs).astype(np.float32)
        return SynthData(
            labels=labels,
            dense=dense,
            cats=self.hash_ids(ranks),
            probs=probs,
            dense_raw=raw,
            dense_missing=missing,
        )

    def rows(self, start: int, stop: int) -> Iterator[SynthData]:
        """Rows ``[start, stop)`` in pieces of at most one block."""
        pos = start
        while pos < stop:
            index = pos // BLOCK_ROWS
            blk = self.block(index)
            lo = pos - index * BLOCK_ROWS
            hi = min(stop - index * BLOCK_ROWS, BLOCK_ROWS)
            yield _slice(blk, lo, hi)
            pos = index * BLOCK_ROWS + hi


_FIELDS = ("labels", "dense", "cats", "probs", "dense_raw", "dense_missing")


def _slice(d: SynthData, lo: int, hi: int) -> SynthData:
    return SynthData(**{name: getattr(d, name)[lo:hi] for name in _FIELDS})


def generate(examples: int, seed: int, config: SynthConfig | None = None) -> SynthData:
    """``examples`` rows from the teacher built from ``seed`` (deterministic)."""
    if examples < 1:
        raise ValueError("examples must be positive")
    teacher = Teacher(seed, config)
    out = SynthData(
        labels=np.empty(examples, np.float32),
        dense=np.empty((examples, NUM_DENSE), np.float32),
        cats=np.empty((examples, NUM_CAT), np.int64),
        probs=np.empty(examples, np.float32),
        dense_raw=np.empty((examples, NUM_DENSE), np.int64),
        dense_missing=np.empty((examples, NUM_DENSE), bool),
    )
    pos = 0
    for part in teacher.rows(0, examples):
        for name in _FIELDS:
            getattr(out, name)[pos : pos + len(part)] = getattr(part, name)
        pos += len(part)
    return out


# ---------------------------------------------------------------------------------------
# Writing Criteo TSV


def format_lines(
    labels: np.ndarray, dense_raw: np.ndarray, dense_missing: np.ndarray, cats: np.ndarray
) -> bytes:
    """Criteo TSV lines (each ending in ``\\n``) for the given rows, built without a Python loop.

    Fields go into a byte matrix with zero bytes as padding, which is then dropped.
    """
    n = len(labels)
    if n == 0:
        return b""
    raw = np.asarray(dense_raw, np.int64)
    mag = np.abs(raw)
    neg = raw < 0
    ndig = np.ones(raw.shape, np.int64)
    power = 10
    while power <= int(mag.max()):
        ndig += mag >= power
        power *= 10
    maxd = int(ndig.max())
    width = maxd + int(neg.any())
    ints = np.zeros((n, NUM_DENSE, 1 + width), np.uint8)
    ints[:, :, 0] = 9
    for k in range(maxd):
        ints[:, :, width - k] = np.where(k < ndig, (mag // 10**k) % 10 + 48, 0)
    r, c = np.nonzero(neg)
    ints[r, c, width - ndig[r, c]] = 45
    ints[np.asarray(dense_missing, bool)] = 0
    ints[:, :, 0] = 9

    u = np.asarray(cats).astype(np.int64).view(np.uint64)
    hexw = 16 if bool((u >> np.uint64(32)).any()) else 8
    hexes = np.zeros((n, NUM_CAT, 1 + hexw), np.uint8)
    for k in range(hexw):
        nibble = (u >> np.uint64(4 * k)) & np.uint64(15)
        hexes[:, :, hexw - k] = _HEX_CHARS[nibble.astype(np.intp)]
    hexes[u == 0] = 0
    if hexw == 16:
        # Values that fit 8 digits keep Criteo's 8-digit form.
        hexes[:, :, 1:9][u < np.uint64(2**32)] = 0
    hexes[:, :, 0] = 9

    out = np.concatenate(
        [
            (np.asarray(labels) != 0).astype(np.uint8)[:, None] + 48,
            ints.reshape(n, -1),
            hexes.reshape(n, -1),
            np.full((n, 1), 10, np.uint8),
        ],
        axis=1,
    )
    return out[out != 0].tobytes()


def write_tsv_dataset(
    out_dir: str | os.PathLike,
    examples: int,
    seed: int,
    eval_fraction: float = 0.1,
    *,
    config: SynthConfig | None = None,
    progress: bool | None = None,
) -> dict:
    """Write ``train.tsv`` and ``eval.tsv`` (the last ``eval_fraction`` of rows) in Criteo
    format, plus ``teacher.json`` with the teacher's NE on each file. Returns that summary.
    """
    if examples < 1:
        raise ValueError("examples must be positive")
    if not 0.0 <= eval_fraction < 1.0:
        raise ValueError("eval_fraction must be in [0, 1)")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    teacher = Teacher(seed, config)
    n_eval = int(round(examples * eval_fraction))
    if eval_fraction > 0 and examples > 1:
        n_eval = min(max(n_eval, 1), examples - 1)
    splits = {"train.tsv": (0, examples - n_eval), "eval.tsv": (examples - n_eval, examples)}
    files: dict[str, dict] = {}
    total_loss = total_clicks = 0.0
    disable = None if progress is None else not progress
    with tqdm(total=examples, unit="ex", desc="writing", disable=disable) as bar:
        for name, (start, stop) in splits.items():
            if stop <= start:
                continue
            loss = clicks = 0.0
            # A hidden temporary name: readers of the directory skip it, and an interrupted
            # run never leaves a truncated file under the real name.
            tmp = out / f".{name}.tmp-{os.getpid()}"
            try:
                with open(tmp, "wb") as f:
                    for part in teacher.rows(start, stop):
                        f.write(
                            format_lines(part.labels, part.dense_raw, part.dense_missing, part.cats)
                        )
                        p = np.clip(part.probs.astype(np.float64), 1e-7, 1 - 1e-7)
                        y = part.labels.astype(np.float64)
                        loss -= float(np.sum(y * np.log(p) + (1 - y) * np.log1p(-p)))
                        clicks += float(y.sum())
                        bar.update(len(part))
                os.replace(tmp, out / name)
            finally:
                tmp.unlink(missing_ok=True)
            rows = stop - start
            total_loss += loss
            total_clicks += clicks
            files[name] = {
                "examples": rows,
                "mean_ctr": clicks / rows,
                "logloss": loss / rows,
                "ne": _ne(loss / rows, clicks / rows),
            }
    summary = {
        "generator": "shadowsync planted teacher",
        "version": SYNTH_VERSION,
        "seed": seed,
        "examples": examples,
        "mean_ctr": total_clicks / examples,
        "files": files,
        "train_ne": files.get("train.tsv", {}).get("ne"),
        "eval_ne": files.get("eval.tsv", {}).get("ne"),
        "teacher": teacher.describe(),
    }
    (out / "teacher.json").write_text(json.dumps(summary, indent=1) + "\n")
    return summary
