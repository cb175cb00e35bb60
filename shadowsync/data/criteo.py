"""Criteo display-ads TSV reader with a binary numpy cache.

One line is ``label <TAB> I1..I13 <TAB> C1..C26``: 40 tab-separated fields. The meaning
follows the DLRM reference loader:

* label: ``0`` or ``1``.
* integer fields I1..I13: empty means 0; a value ``x`` becomes ``log(x + 1)`` as float32.
  Real Criteo data has negative integers (I2 holds -1, -2 and -3). Like the DLRM loader we
  clamp negatives to 0 before the log, so a value is never NaN.
* categorical fields C1..C26: empty means 0; otherwise up to 16 hexadecimal digits, read as
  an unsigned 64-bit number and stored with the same bits in an int64. The modulo by an
  embedding table's size happens when batches are read, not here, so one cache serves every
  table size.

Blank lines are ignored (they still count for line numbers), ``\\r\\n`` line ends are
accepted and the last line needs no line end. Input is a plain file, a gzip file (found by
its magic bytes, whatever its name) or a directory of such files, read in name order; hidden
files, ``*.json`` metadata files and subdirectories of a directory are ignored.

Converting text is slow and done once: for a file ``F`` the arrays go to ``F.ssbin/``, for a
directory ``D`` to ``D/.shadowsync-cache/``, and later opens map the ``.npy`` files. The cache
is reused while every source file keeps its size and mtime. When the data's directory is not
writable the cache goes under ``$SHADOWSYNC_CACHE`` (default ``~/.cache/shadowsync``).

Parsing is vectorized over blocks of a few MB: separators give every field's start and end,
each field's last 8 (or 16) bytes are loaded as one little-endian 64-bit word from a table of
digit values, and the digits are combined inside the word (SWAR), so no Python code runs per
field or per line.
"""

from __future__ import annotations

import errno
import gzip
import hashlib
import json
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, NamedTuple

import numpy as np
from tqdm import tqdm

from shadowsync.data.cache import NpyWriter, build_lock, cache_root, publish_dir
from shadowsync.data.schema import NUM_CAT, NUM_DENSE, log_transform
from shadowsync.errors import UserError

NUM_FIELDS = 1 + NUM_DENSE + NUM_CAT
CACHE_VERSION = 1
FILE_CACHE_SUFFIX = ".ssbin"
DIR_CACHE_NAME = ".shadowsync-cache"
MAX_INT_DIGITS = 16
MAX_HEX_DIGITS = 16

_BLOCK_BYTES = 4 << 20
# Room before the first byte of a block so that 16-byte windows never index below zero.
_PAD = 32
_TAB, _NL, _MINUS = 9, 10, 45

# Digit value of every byte: 0-15 for hex digits, 0xFF for anything else. Decimal fields
# reuse it and reject 10-15 separately.
_DIGIT = np.full(256, 0xFF, np.uint8)
_DIGIT[48:58] = np.arange(10)
_DIGIT[97:103] = np.arange(10, 16)
_DIGIT[65:71] = np.arange(10, 16)

_HIGH_NIBBLES = np.uint64(0xF0F0F0F0F0F0F0F0)
_PLUS_SIX = np.uint64(0x0606060606060606)
_LOW_BYTES = np.uint64(0x00FF00FF00FF00FF)
_LOW_SHORTS = np.uint64(0x0000FFFF0000FFFF)
_LOW_WORD = np.uint64(0xFFFFFFFF)
# _KEEP_LAST[k] keeps the last k characters of a little-endian 8-byte window (its high bytes).
_KEEP_LAST = np.array(
    [0] + [((1 << (8 * k)) - 1) << (8 * (8 - k)) for k in range(1, 9)], dtype=np.uint64
)

# Problem codes per field, used to build error messages.
_OK, _BAD_CHAR, _TOO_LONG, _BAD_LABEL = 0, 1, 2, 3


def field_name(index: int) -> str:
    """Human name of a 0-based field index: ``label``, ``integer I2``, ``categorical C3``."""
    if index == 0:
        return "label"
    if index <= NUM_DENSE:
        return f"integer I{index}"
    return f"categorical C{index - NUM_DENSE}"


@dataclass
class ParsedBlock:
    """Rows parsed from one block of text."""

    labels: np.ndarray  # float32 [n]
    dense: np.ndarray  # float32 [n, 13]
    cats: np.ndarray  # int64 [n, 26]
    lines: int  # lines in the block, blank and bad ones included
    skipped: int  # bad lines dropped (only with skip_bad_lines)

    def __len__(self) -> int:
        return len(self.labels)


def _words(digits: np.ndarray) -> np.ndarray:
    """Unaligned view: element i is the little-endian 64-bit word at byte offset i."""
    return np.ndarray(shape=(len(digits) - 7,), dtype="<u8", buffer=digits, offset=0, strides=(1,))


def _masked_words(
    words: np.ndarray, ends: np.ndarray, ndigits: np.ndarray, wide: bool
) -> tuple[np.ndarray, np.ndarray | None]:
    """The last 8 digits of each field (and the 8 before them when ``wide``), other bytes zeroed."""
    lo = words[ends - 8] & _KEEP_LAST[np.minimum(ndigits, 8)]
    if not wide:
        return lo, None
    hi = words[ends - 16] & _KEEP_LAST[np.clip(ndigits - 8, 0, 8)]
    return lo, hi


def _bad_hex(word: np.ndarray) -> np.ndarray:
    return (word & _HIGH_NIBBLES) != 0


def _bad_dec(word: np.ndarray) -> np.ndarray:
    # Bytes are 0-15 or 0xFF. The first test finds 0xFF; where it fails, every byte is at most
    # 15, so adding 6 cannot carry into the next byte and sets a high nibble exactly for 10-15.
    return ((word & _HIGH_NIBBLES) != 0) | (((word + _PLUS_SIX) & _HIGH_NIBBLES) != 0)


def _pack_hex(word: np.ndarray) -> np.ndarray:
    """Eight hex digit values (first digit in the lowest byte) -> their 32-bit number."""
    w = ((word & _LOW_BYTES) << np.uint64(4)) | ((word >> np.uint64(8)) & _LOW_BYTES)
    w = ((w & _LOW_SHORTS) << np.uint64(8)) | ((w >> np.uint64(16)) & _LOW_SHORTS)
    return ((w & _LOW_WORD) << np.uint64(16)) | (w >> np.uint64(32))


def _pack_dec(word: np.ndarray) -> np.ndarray:
    """Eight decimal digit values (first digit in the lowest byte) -> their number."""
    w = (word & _LOW_BYTES) * np.uint64(10) + ((word >> np.uint64(8)) & _LOW_BYTES)
    w = (w & _LOW_SHORTS) * np.uint64(100) + ((w >> np.uint64(16)) & _LOW_SHORTS)
    return (w & _LOW_WORD) * np.uint64(10000) + (w >> np.uint64(32))


def _show(text: bytes, limit: int = 40) -> str:
    s = text.decode("utf-8", errors="replace")
    if len(s) > limit:
        s = s[:limit] + "..."
    return repr(s)


def parse_block(
    buf: bytes, *, name: str = "<data>", first_line: int = 1, skip_bad_lines: bool = False
) -> ParsedBlock:
    """Parse lines of Criteo TSV (a missing final ``\\n`` is supplied).

    ``first_line`` is the 1-based number of the block's first line, for error messages.
    Raises UserError on the first bad line unless ``skip_bad_lines``.
    """
    if not buf:
        return _empty_block()
    buf, raw = _padded(buf)
    f = _split_fields(raw)
    problem = np.zeros((len(f.ends), NUM_FIELDS), np.uint8)  # per field: _OK or what is wrong
    labels = _labels(raw, f, problem)
    words = _words(_DIGIT[raw])
    dense = _integers(raw, words, f, problem)
    cats = _categoricals(words, f, problem)

    bad_row = problem.any(axis=1)
    n_bad = int(bad_row.sum()) + int(f.wrong_count.sum())
    if n_bad and not skip_bad_lines:
        _raise_first_error(buf, name, first_line, f.wrong_count, f.fields, f.row_line, bad_row,
                           problem, f.starts, f.ends)
    if bad_row.any():
        keep = ~bad_row
        labels, dense, cats = labels[keep], dense[keep], cats[keep]
    return ParsedBlock(
        labels=labels,
        dense=np.ascontiguousarray(dense),
        cats=np.ascontiguousarray(cats),
        lines=f.lines,
        skipped=n_bad,
    )


def _padded(buf: bytes) -> tuple[bytes, np.ndarray]:
    """The block with a final newline and without carriage returns, and its bytes after
    `_PAD` zeros (the 16-byte windows that end at a field never index below zero)."""
    if not buf.endswith(b"\n"):
        buf += b"\n"
    if b"\r" in buf:
        buf = buf.replace(b"\r\n", b"\n")
    raw = np.empty(len(buf) + _PAD, np.uint8)
    raw[:_PAD] = 0
    raw[_PAD:] = np.frombuffer(buf, np.uint8)
    return buf, raw


class _Fields(NamedTuple):
    """Where the fields of a block's well-formed lines lie (one row per such line)."""

    lines: int  # lines in the block
    fields: np.ndarray  # [lines] fields found on each line
    wrong_count: np.ndarray  # [lines] a non-blank line without NUM_FIELDS fields
    row_line: np.ndarray  # [rows] the line of each row
    starts: np.ndarray  # [rows, NUM_FIELDS] first byte of each field in `raw`
    ends: np.ndarray  # [rows, NUM_FIELDS] the separator after it
    lens: np.ndarray  # [rows, NUM_FIELDS] ends - starts


def _split_fields(raw: np.ndarray) -> _Fields:
    seps = np.flatnonzero((raw == _TAB) | (raw == _NL))
    nl_at = np.flatnonzero(raw[seps] == _NL)
    n_lines = len(nl_at)
    fields = np.diff(nl_at, prepend=-1)
    line_end = seps[nl_at]
    line_start = np.empty(n_lines, np.int64)
    line_start[0] = _PAD
    line_start[1:] = line_end[:-1] + 1
    blank = line_end == line_start
    good = fields == NUM_FIELDS
    if good.all():
        ends = seps.reshape(n_lines, NUM_FIELDS)
        row_line = np.arange(n_lines)
    else:
        ends = seps[np.repeat(good, fields)].reshape(-1, NUM_FIELDS)
        row_line = np.flatnonzero(good)
    starts = np.empty_like(ends)
    starts[:, 0] = line_start[row_line]
    starts[:, 1:] = ends[:, :-1] + 1
    return _Fields(n_lines, fields, ~good & ~blank, row_line, starts, ends, ends - starts)


def _labels(raw: np.ndarray, f: _Fields, problem: np.ndarray) -> np.ndarray:
    """Field 0: '0' or '1'."""
    label_char = raw[f.starts[:, 0]]
    label_ok = (f.lens[:, 0] == 1) & ((label_char == 48) | (label_char == 49))
    problem[:, 0] = np.where(label_ok, _OK, _BAD_LABEL)
    return (label_char == 49).astype(np.float32)


def _integers(raw: np.ndarray, words: np.ndarray, f: _Fields, problem: np.ndarray) -> np.ndarray:
    """Fields 1-13: decimal integers (negative ones count as 0), log-transformed."""
    i_starts, i_ends, i_lens = f.starts[:, 1:14], f.ends[:, 1:14], f.lens[:, 1:14]
    negative = (raw[i_starts] == _MINUS) & (i_lens > 0)
    ndig = i_lens - negative
    too_long = ndig > MAX_INT_DIGITS
    ndig = np.minimum(ndig, MAX_INT_DIGITS)
    wide = bool(len(f.ends)) and int(ndig.max()) > 8
    lo, hi = _masked_words(words, i_ends, ndig, wide)
    bad = _bad_dec(lo) | (negative & (ndig == 0))
    values = _pack_dec(lo)
    if hi is not None:
        bad |= _bad_dec(hi)
        values = values + _pack_dec(hi) * np.uint64(100_000_000)
    problem[:, 1:14] = np.where(too_long, _TOO_LONG, np.where(bad, _BAD_CHAR, _OK))
    values = values.view(np.int64)
    values[negative] = 0
    return log_transform(values)


def _categoricals(words: np.ndarray, f: _Fields, problem: np.ndarray) -> np.ndarray:
    """Fields 14-39: hexadecimal ids."""
    c_ends, c_lens = f.ends[:, 14:], f.lens[:, 14:]
    too_long = c_lens > MAX_HEX_DIGITS
    ndig = np.minimum(c_lens, MAX_HEX_DIGITS)
    wide = bool(len(f.ends)) and int(ndig.max()) > 8
    lo, hi = _masked_words(words, c_ends, ndig, wide)
    bad = _bad_hex(lo)
    cats = _pack_hex(lo)
    if hi is not None:
        bad |= _bad_hex(hi)
        cats |= _pack_hex(hi) << np.uint64(32)
    problem[:, 14:] = np.where(too_long, _TOO_LONG, np.where(bad, _BAD_CHAR, _OK))
    return cats.view(np.int64)


def _raise_first_error(
    buf: bytes,
    name: str,
    first_line: int,
    wrong_count: np.ndarray,
    fields: np.ndarray,
    row_line: np.ndarray,
    bad_row: np.ndarray,
    problem: np.ndarray,
    starts: np.ndarray,
    ends: np.ndarray,
) -> None:
    count_lines = np.flatnonzero(wrong_count)
    bad_rows = np.flatnonzero(bad_row)
    first_count = int(count_lines[0]) if len(count_lines) else None
    first_field_line = int(row_line[bad_rows[0]]) if len(bad_rows) else None
    if first_field_line is None or (first_count is not None and first_count < first_field_line):
        assert first_count is not None
        raise UserError(
            f"{name}:{first_line + first_count}: expected {NUM_FIELDS} tab-separated fields, "
            f"got {int(fields[first_count])}"
        )
    row = int(bad_rows[0])
    col = int(np.flatnonzero(problem[row])[0])
    code = int(problem[row, col])
    text = buf[starts[row, col] - _PAD : ends[row, col] - _PAD]
    where = f"{name}:{first_line + first_field_line}"
    if code == _BAD_LABEL:
        raise UserError(f"{where}: label must be 0 or 1, got {_show(text)}")
    head = f"{where}: field {col + 1} ({field_name(col)}): {_show(text)}"
    if col <= NUM_DENSE:
        if code == _TOO_LONG:
            raise UserError(f"{head} is out of range (more than {MAX_INT_DIGITS} digits)")
        raise UserError(f"{head} is not an integer")
    if code == _TOO_LONG:
        raise UserError(f"{head} has more than {MAX_HEX_DIGITS} hexadecimal digits")
    raise UserError(f"{head} is not hexadecimal")


def _empty_block() -> ParsedBlock:
    return ParsedBlock(
        labels=np.zeros(0, np.float32),
        dense=np.zeros((0, NUM_DENSE), np.float32),
        cats=np.zeros((0, NUM_CAT), np.int64),
        lines=0,
        skipped=0,
    )


def parse_bytes(data: bytes, *, name: str = "<data>", skip_bad_lines: bool = False) -> ParsedBlock:
    """Parse a whole text in memory (tests and small inputs); no cache involved."""
    if data and not data.endswith(b"\n"):
        data += b"\n"
    return parse_block(data, name=name, skip_bad_lines=skip_bad_lines)


# ---------------------------------------------------------------------------------------
# Sources


def _open_source(path: Path) -> tuple[BinaryIO, BinaryIO]:
    """(raw file, stream to read text from): gzip is detected by its magic bytes."""
    raw = open(path, "rb")  # noqa: SIM115 - closed by the caller
    magic = raw.read(2)
    raw.seek(0)
    if magic == b"\x1f\x8b":
        return raw, gzip.GzipFile(fileobj=raw, mode="rb")  # type: ignore[return-value]
    return raw, raw


def iter_blocks(
    path: Path,
    shown: str,
    block_bytes: int | None = None,
    progress: Callable[[int], None] | None = None,
) -> Iterator[bytes]:
    """Blocks of whole lines (each ending with ``\\n``) from a plain or gzip file.

    ``progress`` is called with the number of file bytes (compressed bytes for gzip) read.
    """
    block_bytes = block_bytes or _BLOCK_BYTES
    raw, stream = _open_source(path)
    with raw:
        rest = b""
        pos = 0
        while True:
            try:
                chunk = stream.read(block_bytes)
            except (OSError, EOFError) as e:
                if stream is raw:
                    raise
                raise UserError(f"{shown}: corrupt or truncated gzip data ({e})") from None
            if progress is not None:
                now = raw.tell()
                progress(now - pos)
                pos = now
            if not chunk:
                break
            cut = chunk.rfind(b"\n")
            if cut < 0:
                rest += chunk
                continue
            yield rest + chunk[: cut + 1]
            rest = chunk[cut + 1 :]
        if rest:
            yield rest + b"\n"


def list_sources(path: str) -> list[tuple[Path, str]]:
    """The data files behind ``path`` as (real path, name to show in messages)."""
    p = Path(path)
    if not p.exists():
        raise UserError(f"{path}: no such file or directory")
    if p.is_file():
        return [(p, path)]
    if not p.is_dir():
        raise UserError(f"{path}: not a regular file or directory")
    files = sorted(
        c for c in p.iterdir() if not c.name.startswith(".") and c.suffix != ".json" and c.is_file()
    )
    if not files:
        raise UserError(f"{path}: directory has no data files")
    return [(c, os.path.join(path, c.name)) for c in files]


def _stamp(files: list[tuple[Path, str]]) -> list[dict]:
    out = []
    for real, _ in files:
        st = real.stat()
        out.append({"name": real.name, "size": st.st_size, "mtime_ns": st.st_mtime_ns})
    return out


def cache_dirs(path: str) -> list[Path]:
    """Cache locations for ``path``, preferred first: next to the data, then the cache root."""
    p = Path(path)
    near = p / DIR_CACHE_NAME if p.is_dir() else p.with_name(p.name + FILE_CACHE_SUFFIX)
    key = hashlib.sha1(str(p.resolve()).encode()).hexdigest()[:16]
    return [near, cache_root() / "files" / f"{p.name}-{key}"]


def _read_meta(cache: Path) -> dict | None:
    try:
        return json.loads((cache / "meta.json").read_text())
    except (OSError, ValueError):
        return None


def _usable(meta: dict | None, stamp: list[dict], skip_bad_lines: bool) -> bool:
    if not meta or meta.get("version") != CACHE_VERSION or meta.get("sources") != stamp:
        return False
    # A cache built without skipping, or that skipped nothing, serves either setting.
    return meta.get("skip_bad_lines") == skip_bad_lines or meta.get("skipped_lines") == 0


@dataclass
class CriteoArrays:
    """Arrays of a converted data set, memory-mapped from its cache."""

    labels: np.ndarray  # float32 [n]
    dense: np.ndarray  # float32 [n, 13]
    cats: np.ndarray  # int64 [n, 26], raw hash values
    skipped_lines: int
    cache_dir: Path
    converted: bool  # whether this call parsed the text (False: reused the cache)
    sources: list[str]


def convert(
    files: list[tuple[Path, str]], out: Path, *, skip_bad_lines: bool, progress: bool | None = None
) -> dict:
    """Parse ``files`` into ``out`` (labels.npy, dense.npy, cats.npy, meta.json)."""
    stamp = _stamp(files)
    writers = {
        "labels": NpyWriter(out / "labels.npy", np.float32, ()),
        "dense": NpyWriter(out / "dense.npy", np.float32, (NUM_DENSE,)),
        "cats": NpyWriter(out / "cats.npy", np.int64, (NUM_CAT,)),
    }
    skipped = 0
    total = sum(s["size"] for s in stamp)
    try:
        with tqdm(
            total=total,
            unit="B",
            unit_scale=True,
            desc="converting",
            disable=None if progress is None else not progress,
        ) as bar:
            for real, shown in files:
                line = 1
                rows = 0
                for block in iter_blocks(real, shown, progress=bar.update):
                    parsed = parse_block(
                        block, name=shown, first_line=line, skip_bad_lines=skip_bad_lines
                    )
                    line += parsed.lines
                    rows += len(parsed)
                    skipped += parsed.skipped
                    writers["labels"].append(parsed.labels)
                    writers["dense"].append(parsed.dense)
                    writers["cats"].append(parsed.cats)
                if rows == 0:
                    raise UserError(f"{shown}: empty file")
    except BaseException:
        for w in writers.values():
            w.f.close()
        raise
    for w in writers.values():
        w.close()
    meta = {
        "format": "shadowsync-criteo",
        "version": CACHE_VERSION,
        "sources": stamp,
        "rows": writers["labels"].rows,
        "skipped_lines": skipped,
        "skip_bad_lines": skip_bad_lines,
    }
    (out / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
    return meta


def load_cache(
    cache: Path, meta: dict, converted: bool, files: list[tuple[Path, str]]
) -> CriteoArrays:
    return CriteoArrays(
        labels=np.load(cache / "labels.npy", mmap_mode="r"),
        dense=np.load(cache / "dense.npy", mmap_mode="r"),
        cats=np.load(cache / "cats.npy", mmap_mode="r"),
        skipped_lines=int(meta["skipped_lines"]),
        cache_dir=cache,
        converted=converted,
        sources=[shown for _, shown in files],
    )


def _build_cache(
    cache: Path,
    files: list[tuple[Path, str]],
    stamp: list[dict],
    skip_bad_lines: bool,
    progress: bool | None,
) -> CriteoArrays:
    cache.parent.mkdir(parents=True, exist_ok=True)
    with build_lock(cache):
        # Another process may have built it while we waited for the lock.
        meta = _read_meta(cache)
        if _usable(meta, stamp, skip_bad_lines):
            assert meta is not None
            return load_cache(cache, meta, False, files)
        built: dict = {}

        def build(tmp: Path) -> None:
            built.update(convert(files, tmp, skip_bad_lines=skip_bad_lines, progress=progress))

        # The stamp was taken before reading, so a file changed meanwhile is converted
        # again on the next open.
        publish_dir(build, cache)
        return load_cache(cache, built, True, files)


def load(path: str, *, skip_bad_lines: bool = False, progress: bool | None = None) -> CriteoArrays:
    """Open Criteo data at ``path`` (file, .gz or directory), converting it on first use."""
    files = list_sources(path)
    stamp = _stamp(files)
    candidates = cache_dirs(path)
    for cache in candidates:
        meta = _read_meta(cache)
        if _usable(meta, stamp, skip_bad_lines):
            assert meta is not None
            return load_cache(cache, meta, False, files)
    last_error: OSError | None = None
    for cache in candidates:
        try:
            return _build_cache(cache, files, stamp, skip_bad_lines, progress)
        except OSError as e:
            if e.errno not in (errno.EACCES, errno.EPERM, errno.EROFS):
                raise
            last_error = e
    raise UserError(
        f"{path}: cannot write a cache next to the data or under {cache_root()} ({last_error})"
    )
