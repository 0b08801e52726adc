"""Near duplicates among many rows at once: MinHash signatures and LSH, held in numpy arrays.

A text is normalised first (`words`): casefolded, and every run of punctuation, symbols, underscores or
whitespace made one separator, so "Cedar." and "cedar" are one word and spacing does not count. Its word
3-grams (a text of three words or fewer is one gram of them all) are hashed to 32 bits: the words' CRC-32s,
three combined and mixed by MurmurHash3's 64-bit finaliser. A signature holds, for each of NUM_PERM hash
functions h_k(x) = y xor (y >> 16) with y = (a_k x + b_k) mod 2^32, the smallest h_k over the text's grams,
kept as its low 16 bits (b-bit MinHash, Li and König 2010): the share of the positions where two signatures
agree estimates the texts' Jaccard similarity J, too high by at most (1 - J) / 2^16. That is 256 bytes a row,
in pages of one array each (`Signed`), not an object a row.

LSH: BANDS bands of BAND_ROWS positions (datasketch's optimum for threshold 0.8 with 128 permutations, false
positives and negatives weighed alike): rows whose signatures agree on a whole band are candidates, and a
candidate is near when its estimate reaches NEAR_THRESHOLD.
"""

from __future__ import annotations

import itertools
import re
import zlib
from collections.abc import Sequence

import numpy as np

NEAR_THRESHOLD = 0.8
NUM_PERM = 128
SHINGLE_WORDS = 3  # _grams spells out three
BANDS, BAND_ROWS = 9, 13
PAGE = 1 << 16  # rows in one page of signatures
PIECE = 1 << 14  # grams hashed at once: NUM_PERM x PIECE x 4 bytes of work space (8 MiB)

# Fixed, so that a job and its report hash alike, run after run.
_rng = np.random.default_rng(20261205)
_A = (_rng.integers(0, 2**32, NUM_PERM, dtype=np.uint64) | np.uint64(1)).astype(np.uint32)
_B = _rng.integers(0, 2**32, NUM_PERM, dtype=np.uint64).astype(np.uint32)
_MIX = _rng.integers(0, 2**64, SHINGLE_WORDS, dtype=np.uint64) | np.uint64(1)  # combine a gram's words
_BAND_MIX = _rng.integers(0, 2**64, BAND_ROWS, dtype=np.uint64) | np.uint64(1)  # a band's values as one key
_PAD = np.uint64(1 << 32)  # the missing words of a 1- or 2-word text (no CRC-32 is this large)
_SEPARATORS = re.compile(r"[\W_]+")
_ASCII = bytes(ord(chr(c).lower()) if c < 128 and chr(c).isalnum() else 32 for c in range(256))


def words(text: str) -> list[bytes]:
    """The text's words, normalised: casefolded, split at every run of punctuation, symbols and spacing."""
    if text.isascii():  # the same words, a quarter of the time: letters and digits kept, lower-cased
        return text.encode().translate(_ASCII).split()
    return _SEPARATORS.sub(" ", text.casefold()).encode().split()


def _fmix64(x: np.ndarray) -> np.ndarray:
    """MurmurHash3's finaliser, in place: every bit of the input moves every bit of the output."""
    x ^= x >> np.uint64(33)
    x *= np.uint64(0xFF51AFD7ED558CCD)
    x ^= x >> np.uint64(33)
    x *= np.uint64(0xC4CEB9FE1A85EC53)
    x ^= x >> np.uint64(33)
    return x


def _grams(word_lists: Sequence[list[bytes]]) -> tuple[np.ndarray, np.ndarray]:
    """(every text's gram hashes, text after text; how many grams each text has)."""
    lengths = np.fromiter(map(len, word_lists), np.int64, len(word_lists))
    flat = np.fromiter(map(zlib.crc32, itertools.chain.from_iterable(word_lists)), np.uint64, int(lengths.sum()))
    ends = np.cumsum(lengths)
    padded = np.insert(flat, np.repeat(ends, 2), _PAD)  # each text's words, then two pads
    counts = np.where(lengths > 0, np.maximum(lengths - 2, 1), 0)  # a gram starts at each of its first words
    starts = ends - lengths + 2 * np.arange(len(lengths))  # each text's first word in `padded`
    before = np.cumsum(counts) - counts
    at = np.repeat(starts - before, counts) + np.arange(int(counts.sum()))
    mixed = padded[at] * _MIX[0] + padded[at + 1] * _MIX[1] + padded[at + 2] * _MIX[2]
    return (_fmix64(mixed) >> np.uint64(32)).astype(np.uint32), counts


def signatures(texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """(the texts' signatures, (n, NUM_PERM) uint16; whether each text has a word: one without has zeros)."""
    out = np.zeros((len(texts), NUM_PERM), np.uint16)
    if not len(texts):
        return out, np.zeros(0, bool)
    grams, counts = _grams([words(t) for t in texts])
    has = counts > 0
    rows = np.flatnonzero(has)
    if not rows.size:
        return out, has
    first_gram = (np.cumsum(counts) - counts)[rows]
    mins = np.full((rows.size, NUM_PERM), np.iinfo(np.uint32).max, np.uint32)
    for p0 in range(0, grams.size, PIECE):  # a text's grams may span pieces: minima are merged
        p1 = min(p0 + PIECE, grams.size)
        hashed = np.multiply.outer(_A, grams[p0:p1])
        hashed += _B[:, None]
        hashed ^= hashed >> np.uint32(16)
        lo, hi = np.searchsorted(first_gram, p0, "right"), np.searchsorted(first_gram, p1, "left")
        segments = np.concatenate(([p0], first_gram[lo:hi])) - p0
        ids = np.arange(lo - 1, hi)  # the texts whose grams the segments hold, in order
        mins[ids] = np.minimum(mins[ids], np.minimum.reduceat(hashed, segments, axis=1).T)
    out[rows] = mins.astype(np.uint16)  # b-bit: the low 16 bits
    return out, has


def band_keys(sig: np.ndarray, band: int) -> np.ndarray:
    """One uint64 per signature that is equal where the signatures agree on the band (and, by chance, almost
    never elsewhere: a false candidate is only checked and let go)."""
    part = sig[:, band * BAND_ROWS:(band + 1) * BAND_ROWS].astype(np.uint64)
    part *= _BAND_MIX
    return part.sum(axis=1, dtype=np.uint64)


class Signed:
    """Signatures by row, appended a batch at a time into pages of PAGE rows (never copied whole)."""

    def __init__(self) -> None:
        self._pages: list[np.ndarray] = []
        self._has: list[np.ndarray] = []
        self.n = 0

    def __len__(self) -> int:
        return self.n

    def append(self, sig: np.ndarray, has: np.ndarray) -> None:
        done = 0
        while done < len(sig):
            if self.n % PAGE == 0:
                self._pages.append(np.zeros((PAGE, NUM_PERM), np.uint16))  # calloc: untouched rows cost nothing
                self._has.append(np.zeros(PAGE, bool))
            at = self.n % PAGE
            take = min(PAGE - at, len(sig) - done)
            self._pages[-1][at:at + take] = sig[done:done + take]
            self._has[-1][at:at + take] = has[done:done + take]
            self.n += take
            done += take

    @property
    def has(self) -> np.ndarray:
        """Whether each row has a signature (a text with words)."""
        return np.concatenate(self._has)[: self.n] if self._has else np.zeros(0, bool)

    def take(self, rows: np.ndarray | Sequence[int]) -> np.ndarray:
        rows = np.asarray(rows, np.int64)
        out = np.empty((rows.size, NUM_PERM), np.uint16)
        page = rows // PAGE
        for p in np.unique(page):
            where = page == p
            out[where] = self._pages[p][rows[where] % PAGE]
        return out

    def band(self, band: int) -> np.ndarray:
        """Every row's key of one band (`band_keys`)."""
        keys = [band_keys(page[: min(PAGE, self.n - i * PAGE)], band) for i, page in enumerate(self._pages)]
        return np.concatenate(keys) if keys else np.zeros(0, np.uint64)


def _similar(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a == b).mean(axis=1)


def _groups(signed: Signed, members: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(rows, groups): each member that shares a band's key with another member, with that band's group id,
    sorted by row."""
    rows, groups = [], []
    offset = 0
    for band in range(BANDS):
        keys = signed.band(band)[members]
        order = np.argsort(keys, kind="stable")
        ordered = keys[order]
        new = np.ones(len(ordered), bool)
        new[1:] = ordered[1:] != ordered[:-1]
        run = np.cumsum(new) - 1
        sizes = np.bincount(run) if len(run) else np.zeros(0, np.int64)
        shared = sizes[run] > 1
        rows.append(members[order[shared]])
        groups.append(run[shared] + offset)
        offset += len(sizes)
    row, group = np.concatenate(rows), np.concatenate(groups)
    order = np.lexsort((group, row))
    return row[order], group[order]


def near_duplicates(signed: Signed, indexed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(each row's earlier row that it nearly repeats, -1 for none; that similarity), among the rows `indexed`
    (a mask) that have words. Rows are decided in order: a row matches the earliest candidate at or above the
    threshold that is itself kept (no near copy of a row before it)."""
    near_of = np.full(len(signed), -1, np.int64)
    similarity = np.zeros(len(signed), np.float32)
    row, group = _groups(signed, np.flatnonzero(indexed & signed.has))
    if not row.size:
        return near_of, similarity
    kept: dict[int, list[int]] = {}  # group → its kept rows so far, in order
    bounds = np.flatnonzero(np.diff(row)) + 1
    for i, its in zip(row[np.concatenate(([0], bounds))].tolist(), np.split(group, bounds), strict=True):
        its = its.tolist()
        candidates = sorted({c for g in its for c in kept.get(g, ())})
        if candidates:
            found = signed.take([*candidates, i])
            sims = _similar(found[:-1], found[-1:])
            hits = np.flatnonzero(sims >= NEAR_THRESHOLD)
            if hits.size:
                near_of[i], similarity[i] = candidates[hits[0]], sims[hits[0]]
                continue
        for g in its:
            kept.setdefault(g, []).append(i)
    return near_of, similarity


def match(signed: Signed, allowed: np.ndarray, queries: np.ndarray, query_has: np.ndarray,
          ) -> tuple[np.ndarray, np.ndarray]:
    """For each query signature: the earliest `allowed` row (a mask) that shares a band with it and whose
    estimated similarity reaches the threshold, -1 for none; and that similarity."""
    hit = np.full(len(queries), -1, np.int64)
    similarity = np.zeros(len(queries), np.float32)
    live = np.flatnonzero(query_has)
    if not live.size or not len(signed):
        return hit, similarity
    usable = allowed & signed.has
    pairs = []
    for band in range(BANDS):
        query_keys = band_keys(queries[live], band)
        order = np.argsort(query_keys)
        ordered = query_keys[order]
        keys = signed.band(band)
        found = np.flatnonzero(usable & np.isin(keys, ordered))
        lo = np.searchsorted(ordered, keys[found], "left")
        many = np.searchsorted(ordered, keys[found], "right") - lo
        step = np.arange(int(many.sum())) - np.repeat(np.cumsum(many) - many, many)
        pairs.append(np.stack([live[order[np.repeat(lo, many) + step]], np.repeat(found, many)], axis=1))
    query, row = np.unique(np.concatenate(pairs), axis=0).T  # sorted by query, then row
    sims = _similar(queries[query], signed.take(row))
    good = sims >= NEAR_THRESHOLD
    query, row, sims = query[good], row[good], sims[good]
    first = np.flatnonzero(np.r_[True, query[1:] != query[:-1]]) if query.size else np.zeros(0, np.int64)
    hit[query[first]], similarity[query[first]] = row[first], sims[first]
    return hit, similarity
