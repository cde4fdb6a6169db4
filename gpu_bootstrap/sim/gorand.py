"""Go's math/rand (the seeded source of Go < 1.20, which the FGD artifact was built with), so that the artifact's
seeds give the artifact's very pod order and node names (`benchmarks/fgd_reproduction.py --rng go`).

The algorithm (an additive lagged Fibonacci generator, Mitchell and Reeds) is re-implemented here; its 607-word
seeding table `rngCooked` is not copied into this repository but read from a Go source tree
(`src/math/rand/rng.go`: Debian's golang-1.19-src package, or $GOROOT). Only what the artifact calls is provided:
Seed, Int63, Int (one Int63), Intn (Int31n), Shuffle (int31n) and Perm.
"""
from __future__ import annotations

import glob
import os
import re
from pathlib import Path

LEN, TAP = 607, 273
MASK64 = (1 << 64) - 1
INT32_MAX = (1 << 31) - 1


class GoSourceMissing(RuntimeError):
    pass


def rng_go_path() -> Path | None:
    """math/rand/rng.go of an installed Go source tree, or None."""
    roots = [os.environ.get("GOROOT", "")] + sorted(glob.glob("/usr/share/go-*")) + sorted(glob.glob("/usr/lib/go*"))
    roots += ["/usr/local/go"]
    for root in roots:
        path = Path(root) / "src" / "math" / "rand" / "rng.go"
        if root and path.is_file():
            return path
    return None


_COOKED: list[int] = []


def cooked() -> list[int]:
    if not _COOKED:
        path = rng_go_path()
        if path is None:
            raise GoSourceMissing("Go's math/rand source (src/math/rand/rng.go) was not found: install Debian's "
                                  "golang-1.19-src or set GOROOT to a Go source tree")
        text = path.read_text()
        start = text.index("rngCooked [rngLen]int64 = [...]int64{")
        body = text[text.index("{", start) + 1:text.index("}", start)]
        numbers = [int(n) for n in re.findall(r"-?\d+", re.sub(r"//[^\n]*", "", body))]
        if len(numbers) != LEN:
            raise GoSourceMissing(f"{path}: rngCooked has {len(numbers)} numbers, not {LEN}")
        _COOKED.extend(n & MASK64 for n in numbers)
    return _COOKED


def _seedrand(x: int) -> int:
    """x[n+1] = 48271 * x[n] mod (2**31 - 1), in Go's int32 arithmetic (truncating division)."""
    hi, lo = divmod(x, 44488)
    x = 48271 * lo - 3399 * hi
    return x + INT32_MAX if x < 0 else x


class GoRand:
    def __init__(self, seed: int):
        table = cooked()
        self.tap, self.feed = 0, LEN - TAP
        seed %= INT32_MAX
        x = seed or 89482311
        self.vec = [0] * LEN
        for i in range(-20, LEN):
            x = _seedrand(x)
            if i >= 0:
                u = (x << 40) & MASK64
                x = _seedrand(x)
                u ^= (x << 20) & MASK64
                x = _seedrand(x)
                self.vec[i] = u ^ x ^ table[i]

    def int63(self) -> int:
        self.tap = (self.tap - 1) % LEN
        self.feed = (self.feed - 1) % LEN
        x = (self.vec[self.feed] + self.vec[self.tap]) & MASK64
        self.vec[self.feed] = x
        return x & ((1 << 63) - 1)

    def intn(self, n: int) -> int:
        """Intn for 0 < n < 2**31: Int31n, modulo with rejection."""
        if n & (n - 1) == 0:
            return (self.int63() >> 32) & (n - 1)
        limit = INT32_MAX - (1 << 31) % n
        v = self.int63() >> 32
        while v > limit:
            v = self.int63() >> 32
        return v % n

    def _int31n(self, n: int) -> int:
        """The unexported int31n (Lemire's multiply-shift) that Shuffle uses."""
        prod = (self.int63() >> 31) * n
        if prod & 0xFFFFFFFF < n:
            threshold = (-n & 0xFFFFFFFF) % n
            while prod & 0xFFFFFFFF < threshold:
                prod = (self.int63() >> 31) * n
        return prod >> 32

    def shuffle(self, items: list) -> None:
        for i in range(len(items) - 1, 0, -1):
            j = self._int31n(i + 1)
            items[i], items[j] = items[j], items[i]

    def perm(self, n: int) -> list[int]:
        out = [0] * n
        for i in range(n):
            j = self.intn(i + 1)
            out[i] = out[j]
            out[j] = i
        return out
