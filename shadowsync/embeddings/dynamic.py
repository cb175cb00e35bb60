"""Raw ids -> rows of a bounded pool: the id map of a dynamic embedding table.

Production ids are raw 64-bit numbers (or strings hashed to them), unbounded and drifting.
Instead of folding them modulo a table size (unrelated ids then share a row), a holder keeps
an id -> row map over a pool of `capacity` rows, as the parameter servers of Monolith,
DeepRec (EmbeddingVariable), PERSIA and XDL do, and TorchRec's managed-collision modules:

- **keys**: a (table, id) pair is one 64-bit key, the table in its top byte and 56 bits of
  ``mix64(id XOR table * G)`` below (`raw_keys`; mix64 is SplitMix64's finaliser, a bijection
  of 64-bit words, G the golden-ratio constant), so every table a holder keeps shares one map
  and one pool of rows, and a row's key still says its table (a saved model is cut back into
  tables by it). Two ids of one table share a key with probability 2^-56 a pair (for 10^7
  ids of a table, about 7 x 10^-4 pairs in all). The key also routes the id to its server
  (``key mod servers``): stable across processes and runs.
- **admission**: an id not in the map gets a row only once it has been seen `admit_after`
  times. Sightings are counted in a count-min sketch (Cormode and Muthukrishnan 2005) of
  `depth` rows of `width` counters: ``count(k) = min_j C[j, h_j(k)]``, which never
  undercounts and overcounts by at most ``e * N / width`` with probability ``1 - e^-depth``
  (N: sightings in the sketch). Every counter is halved each time `width / 2` sightings
  have been added since the last halving, so N stays below `width` (a key picks up less
  than one sighting of others a row on average, and the least of the rows is mostly none)
  however long the stream: unhalved, a long tail fills every counter and each id seen once
  reads as seen `admit_after` times. Sightings so count with a decay: an id needs its
  `admit_after` sightings within a few such windows. Until admitted an id reads row 0, the
  default row (kept at zeros), and its gradient is dropped.
- **eviction**: when the pool is full, the rows used longest ago (least recently used, by a
  clock that counts examples) are freed for new ids; with ``ttl:N`` rows not used in the last
  N examples are also freed as they expire. Neither frees a row that a process still holds.
- **holds**: a process that resolves ids for a training step uses their rows until it has
  applied the step's gradients, while others go on admitting. Each such process (a `user`:
  a pid, or a client's token on a server) keeps a pin in `holds`: the clock of the oldest
  resolve whose rows it still uses (its last one; with ``keep_previous``, the one before,
  for clients that resolve the next batch before pushing the current one). Resolves that
  hold run under the lock, so the clock and the rows' ages only grow, and a row resolved at
  clock c has ``last_used >= c``. Hence no row with ``last_used >= min(pins)`` is freed:
  every held row is among them (and a few others, used since by anyone). A find runs
  without the lock first; if any row was freed meanwhile (the `evicted` counter moved), the
  rows whose key changed are found again under it.

The map is an open-addressing hash table (linear probing) of at least twice `capacity`
slots, searched for a whole batch at once: each round probes every id still looking, and the
rounds end when each id has found its key or an empty slot. A slot holds a row number alone
(int32; 0: empty, -1: a tombstone, whose row key is TOMBSTONE) and the row's key is read from
`row_key`: 4 bytes a slot rather than 16, and an empty slot reads as the default row, so a
probe's last slot is its answer. A key's home slot is a run of its own bits: keys are mixed
already, and bits 16 and up are unrelated to the server a key goes to (key mod servers).
Only the first `used` slots are in use, a power of two that grows with the keys held: a
lookup's random reads then stay in a table the size of the ids seen, not of the budget (a
pool of 2.6M rows has 32 MB of slots; the default job's 76,000 ids use 2 to 4 MB, and a
batch's probe took 0.13 ms of CPU against 0.16 in all 32 MB, on a loaded machine). Keys and
tombstones are kept within a quarter of `used` (most ids end on their home slot): past it,
the table is rebuilt in at least 8 times as many slots as keys; once `used` is every slot,
within three quarters of it. Freed keys leave a tombstone, which a rebuild drops.
Checkpoints hold the rows' keys, not the slots (loading rebuilds the table), nor the holds.
Everything is a numpy array over the `tensors` (torch, so that a holder can put them in shared
memory): the caller serialises calls (one lock per map), and copies `state_dict` under it.
"""

from __future__ import annotations

import numpy as np
import torch

from shadowsync.data.ids import mix64
from shadowsync.spec.table_budget import LRU, Eviction

GOLDEN = np.uint64(0x9E3779B97F4A7C15)
EMPTY = np.iinfo(np.int64).min  # the row_key of a free row (and of the default row)
TOMBSTONE = EMPTY + 1  # the row_key a tombstone slot reads (see `_TOMB_ROW`)
FREE = EMPTY
_EMPTY_SLOT, _TOMB_SLOT = 0, -1  # a slot's row: never used; its key was evicted
_HOME_SHIFT = 16  # a key's home slot: its bits from here up
DEFAULT_ROW = 0
MAX_TABLES = 256  # the tables one key space holds (the key's top byte)

# meta: the map's scalars, in one tensor so that they are shared with the arrays.
_LIVE, _TOMBS, _CLOCK, _FREE_TOP, _SWEPT, _COUNTED = range(6)
COUNTERS = ("lookups", "hits", "admitted", "rejected", "evicted")
_FIRST_COUNTER = 6
# The slots in use (see the module), and the highest row ever given to an id (rows above it
# still hold their first draw: see `admit`); last, so that a saved map's scalars read the same
# with or without them (the table is rebuilt on load, and a loaded map takes every row as used).
_SLOTS_USED = _FIRST_COUNTER + len(COUNTERS)
_HIGHEST_GIVEN = _SLOTS_USED + 1
_UNSAVED = 2
# holds: a row per process that holds rows (user token, its pin, the clock of its last hold);
# a token of 0 marks a free row.
MAX_USERS = 1024
_USER, _PIN, _LAST = range(3)
_MIN_SLOTS = 1 << 12
_FEW_KEYS = 16  # inserted one at a time (see `_insert`)


def raw_keys(tables: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """The int64 key of each (table, raw id) pair (ids taken as unsigned 64-bit numbers,
    tables below MAX_TABLES); broadcasts like numpy."""
    t = np.asarray(tables).astype(np.uint64)
    with np.errstate(over="ignore"):
        keys = np.asarray(ids, dtype=np.int64).view(np.uint64) ^ (t * GOLDEN)
        mix64(keys, out=keys)
        keys >>= np.uint64(8)
        keys |= t << np.uint64(56)
    keys = keys.view(np.int64)
    # The two sentinels are keys no pair may have (both in table 128's range): the pairs
    # that would take them take the key two above instead. Only table 128's keys can be
    # either, so the batches of fewer tables skip the search.
    if t.size and t.max() >= 128:
        keys[keys <= TOMBSTONE] += 2
    return keys


def _one_of_each(values: np.ndarray) -> np.ndarray:
    """A position of each distinct value (the positions in any order): the values as they
    are when they are distinct already, the common case, else one sort."""
    ordered = np.sort(values)
    if not (ordered[1:] == ordered[:-1]).any():
        return np.arange(len(values))
    order, _, first = _sorted_runs(values)
    return order[first]


def _distinct(values: np.ndarray, counted: bool) -> tuple[np.ndarray, np.ndarray,
                                                           np.ndarray | None]:
    """np.unique(values, return_inverse=True, return_counts=counted) for a 1-d array, the
    counts None when not `counted`, but the distinct values in any order: one sort and a few
    passes (np.unique's overhead was a fifth of admitting a step's few dozen new ids), or a
    dict for a few values (a training step's new ids, once the map is warm)."""
    if len(values) <= _FEW_KEYS:
        place: dict[int, int] = {}
        inverse = np.array([place.setdefault(v, len(place)) for v in values.tolist()],
                           dtype=np.int64)
        counts = np.bincount(inverse, minlength=len(place)) if counted else None
        return np.fromiter(place, dtype=np.int64, count=len(place)), inverse, counts
    order, ordered, first = _sorted_runs(values)
    inverse = np.empty(len(values), dtype=np.int64)
    inverse[order] = np.cumsum(first) - 1
    counts = np.diff(np.flatnonzero(first), append=len(values)) if counted else None
    return ordered[first], inverse, counts


def _sorted_runs(values: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The order that sorts `values`, the values in it, and which of them start a run of
    equal values (one per distinct value)."""
    order = np.argsort(values)
    ordered = values[order]
    first = np.empty(len(values), dtype=bool)
    first[:1] = True
    np.not_equal(ordered[1:], ordered[:-1], out=first[1:])
    return order, ordered, first


def _signed(word: int) -> int:
    """A 64-bit word as the int64 with the same bits."""
    word %= 1 << 64
    return word - (1 << 64) if word >= 1 << 63 else word


def _shift_right(x: torch.Tensor, bits: int) -> torch.Tensor:
    """Logical right shift of int64 words (torch's >> keeps the sign)."""
    return (x >> bits) & ((1 << (64 - bits)) - 1)


def raw_keys_torch(table: int, ids: torch.Tensor) -> torch.Tensor:
    """`raw_keys` of one table's int64 ids in torch operations alone (int64 products wrap as
    uint64 ones do), so that a model exported with torch.export maps raw ids itself."""
    x = ids ^ _signed(table * int(GOLDEN))
    x = x ^ _shift_right(x, 30)
    x = x * _signed(0xBF58476D1CE4E5B9)
    x = x ^ _shift_right(x, 27)
    x = x * _signed(0x94D049BB133111EB)
    x = x ^ _shift_right(x, 31)
    keys = _shift_right(x, 8) | _signed(table << 56)
    return torch.where(keys <= int(TOMBSTONE), keys + 2, keys)


def table_of(keys: np.ndarray) -> np.ndarray:
    """The table each key belongs to (its top byte)."""
    return (keys.view(np.uint64) >> np.uint64(56)).astype(np.int64)


def server_of(keys: np.ndarray, servers: int) -> np.ndarray:
    """The server that owns each key: stable, and uniform whatever the ids look like."""
    return (keys.view(np.uint64) % np.uint64(servers)).astype(np.int64)


def slot_count(capacity: int) -> int:
    """Hash-table slots for a pool of `capacity` rows: a power of two >= 2 x capacity."""
    return 1 << max(3, (2 * capacity - 1).bit_length())


def map_tensors(capacity: int, sketch_width: int, sketch_depth: int) -> dict[str, torch.Tensor]:
    """The arrays of an empty map (see `DynamicRowMap`); `map_bytes` counts them."""
    if capacity >= np.iinfo(np.int32).max:
        raise ValueError(f"a pool holds fewer than 2^31 - 1 rows, not {capacity:,}")
    keys = torch.full((capacity + 2,), FREE, dtype=torch.int64)
    keys[-1] = int(TOMBSTONE)  # the key of row -1, which tombstone slots name
    return {
        "slots": torch.zeros(slot_count(capacity), dtype=torch.int32),
        "row_key": keys,
        "last_used": torch.zeros(capacity + 1, dtype=torch.int64),
        # Free rows, a stack popped from its top: rows 1, 2, 3... first.
        "free": torch.arange(capacity, 0, -1, dtype=torch.int32),
        "sketch": torch.zeros(sketch_depth, sketch_width, dtype=torch.int32),
        "meta": torch.tensor([0, 0, 0, capacity, 0, 0] + [0] * len(COUNTERS)
                             + [min(_MIN_SLOTS, slot_count(capacity)), 0], dtype=torch.int64),
        "holds": torch.zeros(MAX_USERS, 3, dtype=torch.int64),
    }


def map_bytes(capacity: int, sketch_width: int, sketch_depth: int) -> int:
    """The bytes of `map_tensors(capacity, ...)`, without allocating them."""
    return (4 * slot_count(capacity) + 8 * (capacity + 2) + 8 * (capacity + 1) + 4 * capacity
            + 4 * sketch_depth * sketch_width + 8 * (_SLOTS_USED + _UNSAVED) + 24 * MAX_USERS)


class DynamicRowMap:
    """An id -> row map over rows 1..capacity of a pool (row 0: the default row)."""

    def __init__(self, capacity: int, admit_after: int = 1, eviction: Eviction = LRU,
                 sketch_width: int = 1 << 20, sketch_depth: int = 4,
                 tensors: dict[str, torch.Tensor] | None = None) -> None:
        if capacity < 1 or admit_after < 1:
            raise ValueError("capacity and admit_after must be positive")
        if sketch_width < 2 and admit_after > 1 or sketch_width & (sketch_width - 1):
            raise ValueError(f"sketch_width must be a power of two (>= 2 to count), "
                             f"got {sketch_width}")
        self.capacity, self.admit_after, self.eviction = capacity, admit_after, eviction
        self.tensors = tensors if tensors is not None else map_tensors(
            capacity, sketch_width, sketch_depth)
        self.bind()

    def bind(self) -> None:
        """Take numpy views of the tensors again: after they moved (`share_memory_`) or the
        map arrived in another process (views are not pickled, the tensors are)."""
        a = {k: t.numpy() for k, t in self.tensors.items()}
        self._slots, self._key_of_row = a["slots"], a["row_key"]
        self._row_key = self._key_of_row[:-1]  # rows 0..capacity (row -1: the tombstones')
        self._last_used, self._free = a["last_used"], a["free"]
        self._sketch, self._meta, self._holds = a["sketch"], a["meta"], a["holds"]
        self._slot_of: dict[int, int] = {}  # user token -> its row of `holds` (a guess)
        depth = self._sketch.shape[0]
        self._sketch_salt = mix64(np.arange(1, depth + 1, dtype=np.uint64) * GOLDEN) | np.uint64(1)

    def __getstate__(self) -> dict[str, object]:
        return {k: v for k, v in self.__dict__.items() if not k.startswith("_")}

    def __setstate__(self, state: dict[str, object]) -> None:
        self.__dict__.update(state)
        self.bind()

    # -- what a holder asks ------------------------------------------------------------------
    def resolve(self, keys: np.ndarray, examples: int = 0, admit: bool = True
                ) -> tuple[np.ndarray, np.ndarray]:
        """Rows of `keys` (int64, repeats allowed) and the rows newly given to an id in this
        call. `examples` advance the clock first. With `admit` false (evaluation, serving)
        nothing is counted, touched or admitted: ids not in the map read the default row.
        Only the rows of this call are held. (`admissions`, `evictions`, `find`, then under
        the lock `refind`, `touch`, `hold` and `admit` when `needs_admit` says so: the same
        in steps, for holders shared by processes.)"""
        seen = self.admissions()
        rows = self.find(keys)
        if not admit:
            return rows, np.empty(0, dtype=np.int64)
        clock, _ = self.touch(rows, examples)
        return rows, self.admit(keys, rows, clock, seen)[0]

    def admissions(self) -> int:
        """How many ids have been given a row so far: read before a `find`, it tells `admit`
        whether any key can have entered the map since."""
        return int(self._meta[_FIRST_COUNTER + COUNTERS.index("admitted")])

    def evictions(self) -> int:
        """How many rows have been freed so far: read before a `find`, it tells `refind`
        whether any row found can have left its key since."""
        return int(self._meta[_FIRST_COUNTER + COUNTERS.index("evicted")])

    def refind(self, keys: np.ndarray, rows: np.ndarray, evicted: int) -> None:
        """Under the lock: find again (into `rows`) the keys whose row was freed since
        `evictions` read `evicted`, before `rows` were found without the lock."""
        if evicted == self.evictions():
            return
        stale = np.flatnonzero((rows != DEFAULT_ROW) & (self._row_key[rows] != keys))
        if len(stale):
            rows[stale] = self.find(keys[stale])

    def hold(self, user: int, clock: int, keep_previous: bool = False) -> None:
        """Under the lock, after `touch`ing a batch's rows at `clock`: `user` (a nonzero
        token) holds them, and, with `keep_previous`, still the rows of its hold before
        (whose gradients it has yet to push); its older rows it holds no more."""
        slot = self._slot(user, clock)
        row = self._holds[slot]
        row[_PIN] = row[_LAST] if keep_previous else clock
        row[_LAST] = clock

    def release(self, user: int) -> None:
        """Under the lock: `user` holds no rows any more (it has left)."""
        for slot in np.flatnonzero(self._holds[:, _USER] == user):
            self._holds[slot] = 0
        self._slot_of.pop(user, None)

    def _slot(self, user: int, clock: int) -> int:
        """`user`'s row of `holds`, taken (pinned at `clock`) if it has none."""
        holds, slot = self._holds, self._slot_of.get(user)
        if slot is not None and holds[slot, _USER] == user:
            return slot
        mine = np.flatnonzero(holds[:, _USER] == user)
        if len(mine):
            slot = int(mine[0])
        else:
            free = np.flatnonzero(holds[:, _USER] == 0)
            if not len(free):
                raise RuntimeError(f"dynamic tables: more than {MAX_USERS} processes hold "
                                   f"rows of one pool")
            slot = int(free[0])
            holds[slot] = (user, clock, clock)
        self._slot_of[user] = slot
        return slot

    def _held_from(self, clock: int) -> int:
        """The clock from which rows may be held: no row used at or after it is freed (the
        oldest pin, or `clock`, that of the call freeing rows)."""
        holds = self._holds
        pins = holds[holds[:, _USER] != 0, _PIN]
        return min(clock, int(pins.min())) if len(pins) else clock

    def find(self, keys: np.ndarray) -> np.ndarray:
        """The rows of `keys`, the default row for keys not in the map. Safe without the
        lock: a key being inserted meanwhile reads as missing or as its row (the row's key
        is written before the slot that names it), and a key being evicted may still read
        its old row, as Hogwild updates race."""
        return self._probe(keys)[1]  # an empty slot: row 0

    def touch(self, rows: np.ndarray, examples: int, counted: bool = True) -> tuple[int, int]:
        """A training step's use of `rows`, under the lock (so that ages only grow): the
        clock advances by `examples`, the rows found are marked used now, the lookups
        counted if `counted`. The clock, and the lookups that found no row."""
        meta = self._meta
        meta[_CLOCK] += examples
        clock = int(meta[_CLOCK])
        self._last_used[rows] = clock  # the default row's too: nothing reads its age
        hits = int(np.count_nonzero(rows))
        if counted:
            meta[_FIRST_COUNTER + COUNTERS.index("lookups")] += len(rows)
            meta[_FIRST_COUNTER + COUNTERS.index("hits")] += hits
        return clock, len(rows) - hits

    def needs_admit(self, misses: int, clock: int) -> bool:
        """Whether `admit` has work: ids without a row (`touch`'s misses), or expired rows
        to free."""
        ttl = self.eviction.ttl
        return misses > 0 or (ttl is not None and clock - self._meta[_SWEPT] >= max(1, ttl // 8))

    def admit(self, keys: np.ndarray, rows: np.ndarray, clock: int, seen: int | None = None
              ) -> tuple[np.ndarray, np.ndarray]:
        """Under the lock: count the sightings of the keys `rows` has no row for, give rows
        to those seen `admit_after` times (into `rows`) and free expired rows. `seen`: the
        `admissions` read before `rows` were found (None: unknown), so that the missing keys
        are looked up again only if another process has admitted ids since.

        The rows newly given out, and those of them that held another id before: their
        contents are the holder's to reset. Rows are given from 1 up until some are freed, so
        a row above the highest one given so far still holds the pool's first draw."""
        empty = np.empty(0, dtype=np.int64)
        self._expire(clock)
        miss = np.flatnonzero(rows == DEFAULT_ROW)
        if len(miss) and seen != self.admissions():
            rows[miss] = self.find(keys[miss])
            self._last_used[rows[miss]] = clock  # used now, as the rows found first were
            miss = miss[rows[miss] == DEFAULT_ROW]
        if not len(miss):
            return empty, empty
        new, inverse, counts = _distinct(keys[miss], counted=self.admit_after > 1)
        admitted = (np.ones(len(new), dtype=bool) if counts is None
                    else self._count(new, counts) >= self.admit_after)
        wanted = int(np.count_nonzero(admitted))
        room = self._make_room(wanted, clock)
        if room < wanted:  # the pool is all in use by this call: the rest wait
            admitted[np.flatnonzero(admitted)[room:]] = False
        fresh = self._take_rows(min(room, wanted))
        row_of_new = np.zeros(len(new), dtype=np.int64)
        row_of_new[admitted] = fresh
        meta = self._meta
        if self._crowded(int(meta[_LIVE] + meta[_TOMBS]) + len(fresh)):
            self._rebuild(len(fresh))
        # The rows' keys before the slots that name them: a reader without the lock that
        # finds a slot finds its key.
        admitted_keys = new[admitted]
        self._row_key[fresh] = admitted_keys
        self._last_used[fresh] = clock
        self._insert(admitted_keys, fresh)
        got = row_of_new[inverse]
        rows[miss] = got
        meta[_FIRST_COUNTER + COUNTERS.index("admitted")] += len(fresh)
        meta[_FIRST_COUNTER + COUNTERS.index("rejected")] += len(got) - int(
            np.count_nonzero(got))
        highest = int(meta[_HIGHEST_GIVEN])
        reused = fresh[fresh <= highest]
        if len(fresh):
            meta[_HIGHEST_GIVEN] = max(highest, int(fresh.max()))
        return fresh, reused

    def counters(self) -> dict[str, int]:
        """lookups, hits, admitted, rejected (lookups answered by the default row because
        the id was not admitted), evicted; and live rows, capacity, clock (examples)."""
        meta = self._meta
        out = {name: int(meta[_FIRST_COUNTER + i]) for i, name in enumerate(COUNTERS)}
        out.update(live=int(meta[_LIVE]), capacity=self.capacity, clock=int(meta[_CLOCK]))
        return out

    def live_keys(self) -> tuple[np.ndarray, np.ndarray]:
        """(keys, rows) of every id holding a row, by row."""
        rows = np.flatnonzero(self._row_key != FREE)
        return self._row_key[rows], rows

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The map's tensors (live: copy them under the lock) but the hash table, which
        `load_state_dict` rebuilds from the rows' keys (`row_key`: rows 0..capacity), and
        the holds, which belong to the processes of a run."""
        state = {k: t for k, t in self.tensors.items() if k not in ("slots", "holds")}
        state["row_key"] = state["row_key"][:-1]
        state["meta"] = state["meta"][:_SLOTS_USED]
        return state

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        for name, t in self.state_dict().items():
            if state[name].shape != t.shape:
                raise ValueError(f"id map {name}: saved shape {tuple(state[name].shape)}, "
                                 f"this map's {tuple(t.shape)}")
            t.copy_(state[name])
        self._meta[_HIGHEST_GIVEN] = self.capacity  # which rows were ever used is not saved
        self._rebuild()

    # -- the hash table ----------------------------------------------------------------------
    def _probe(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The slot holding each key, or the empty slot where its search ended; and what
        that slot held when read (the key's row, or 0), which another process may change
        right after (its row is not read again). The first round, where nearly every key
        ends, runs over the whole batch without index arrays."""
        slots, key_of_row = self._slots, self._key_of_row
        mask = int(self._meta[_SLOTS_USED]) - 1
        pos = keys >> _HOME_SHIFT
        pos &= mask
        row = slots[pos].astype(np.int64)  # indexes `key_of_row` as it is, unconverted
        look = np.flatnonzero(key_of_row[row] != keys)
        if not len(look):
            return pos, row
        look = look[row[look] != _EMPTY_SLOT]  # the others end here, missing
        step = (pos[look] + 1) & mask
        while len(look):
            at = slots[step]
            going = (key_of_row[at] != keys[look]) & (at != _EMPTY_SLOT)
            pos[look], row[look] = step, at
            look, step = look[going], (step[going] + 1) & mask
        return pos, row

    def _insert(self, keys: np.ndarray, rows: np.ndarray) -> None:
        """Put distinct keys that are not in the table (their rows' `row_key` set already):
        each takes the first empty or tombstone slot from its home; of several keys reaching
        one free slot in a round, one takes it and the others probe on. A few keys (a
        training step's new ids, once the map is warm) go one at a time: a round of numpy
        calls costs more than a handful of keys probed in Python."""
        meta, slots = self._meta, self._slots
        mask = int(meta[_SLOTS_USED]) - 1
        if len(keys) <= _FEW_KEYS:
            for key, row in zip(keys.tolist(), rows.tolist()):
                pos = (key >> _HOME_SHIFT) & mask
                while slots[pos] > _EMPTY_SLOT:
                    pos = (pos + 1) & mask
                if slots[pos] == _TOMB_SLOT:
                    meta[_TOMBS] -= 1
                slots[pos] = row
            meta[_LIVE] += len(keys)
            return
        look = np.arange(len(keys))
        pos = (keys >> _HOME_SHIFT) & mask
        while len(look):
            at = slots[pos]
            open_ = at <= _EMPTY_SLOT  # empty, or a tombstone
            wants = np.flatnonzero(open_)
            won = wants[_one_of_each(pos[wants])]
            meta[_TOMBS] -= int(np.count_nonzero(at[won] == _TOMB_SLOT))
            slots[pos[won]] = rows[look[won]]
            if len(won) == len(look):  # mostly in the first round: keys are few, slots many
                break
            placed = np.zeros(len(look), dtype=bool)
            placed[won] = True
            step = ~open_  # an occupied slot: probe the next; a lost race: look again
            look, pos = look[~placed], np.where(step, (pos + 1) & mask, pos)[~placed]
        meta[_LIVE] += len(keys)

    def _crowded(self, filled: int) -> bool:
        """Whether `filled` slots (keys and tombstones) call for a rebuild: past a quarter
        of the slots in use while the table can grow, past three quarters once it cannot."""
        used = int(self._meta[_SLOTS_USED])
        return filled > (used // 4 if used < len(self._slots) else 3 * used // 4)

    def _rebuild(self, coming: int = 0) -> None:
        """The table again from the rows' keys, without tombstones, in the slots for them
        and `coming` keys more: a power of two at least 8 times as many, at least
        `_MIN_SLOTS`, at most all of them."""
        keys, rows = self.live_keys()
        meta = self._meta
        self._slots[:meta[_SLOTS_USED]] = _EMPTY_SLOT  # the slots past it are empty already
        wanted = 1 << (8 * (len(keys) + coming) - 1).bit_length()
        meta[_SLOTS_USED] = min(len(self._slots), max(_MIN_SLOTS, wanted))
        meta[_LIVE] = 0
        meta[_TOMBS] = 0
        self._insert(keys, rows)

    # -- admission and eviction --------------------------------------------------------------
    def _count(self, keys: np.ndarray, counts: np.ndarray) -> np.ndarray:
        """Add `counts` sightings of the distinct `keys` to the sketch; their estimates.
        Then halve every counter if `width / 2` sightings have come since the last time."""
        if self.admit_after == 1:
            return np.ones(len(keys), dtype=np.int64)
        # Keys are mixed already: multiply-shift hashing (one odd multiplier a row, the top
        # bits of the product) spreads them over a row's power-of-two counters.
        shift = np.uint64(64 - (self._sketch.shape[1].bit_length() - 1))
        estimate = np.full(len(keys), np.iinfo(np.int64).max)
        added = counts.astype(np.int32)
        with np.errstate(over="ignore"):
            for j, factor in enumerate(self._sketch_salt):
                col = ((keys.view(np.uint64) * factor) >> shift).astype(np.int64)
                np.add.at(self._sketch[j], col, added)
                estimate = np.minimum(estimate, self._sketch[j][col])
        self._meta[_COUNTED] += int(counts.sum())
        if self._meta[_COUNTED] >= self._sketch.shape[1] // 2:
            self._sketch >>= 1
            self._meta[_COUNTED] = 0
        return estimate

    def _take_rows(self, n: int) -> np.ndarray:
        top = int(self._meta[_FREE_TOP])
        rows = self._free[top - n:top][::-1].astype(np.int64)
        self._meta[_FREE_TOP] = top - n
        return rows

    def _release(self, rows: np.ndarray) -> None:
        """Free `rows`: their keys leave the table (tombstones), the rows join the free stack."""
        if not len(rows):
            return
        self._slots[self._probe(self._row_key[rows])[0]] = _TOMB_SLOT
        meta = self._meta
        meta[_LIVE] -= len(rows)
        meta[_TOMBS] += len(rows)
        self._row_key[rows] = FREE
        top = int(meta[_FREE_TOP])
        self._free[top:top + len(rows)] = rows
        meta[_FREE_TOP] = top + len(rows)
        meta[_FIRST_COUNTER + COUNTERS.index("evicted")] += len(rows)

    def _make_room(self, wanted: int, clock: int) -> int:
        """Free rows until `wanted` are free, the least recently used first (at least a
        64th of the pool at a time, so that eviction's full scan is paid rarely); rows that
        may be held (`_held_from`) stay. The rows free now."""
        free = int(self._meta[_FREE_TOP])
        if wanted <= free:
            return wanted
        used = np.flatnonzero(self._row_key != FREE)
        age = self._last_used[used]
        idle = np.flatnonzero(age < self._held_from(clock))
        n = min(len(idle), max(wanted - free, self.capacity // 64))
        if n:
            oldest = idle[np.argpartition(age[idle], n - 1)[:n]] if n < len(idle) else idle
            self._release(used[oldest])
        return min(wanted, int(self._meta[_FREE_TOP]))

    def _expire(self, clock: int) -> None:
        """ttl:N: free the rows idle for N examples and held by no process, checked every
        N/8 examples."""
        ttl = self.eviction.ttl
        if ttl is None or clock - self._meta[_SWEPT] < max(1, ttl // 8):
            return
        self._meta[_SWEPT] = clock
        used = np.flatnonzero(self._row_key != FREE)
        self._release(used[self._last_used[used] < min(clock - ttl, self._held_from(clock))])
