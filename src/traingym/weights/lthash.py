"""An additive (homomorphic) hash of a state, updated from its changes alone.

The hash is the sum over every element of h(name, position, value bits) in (Z_2^64)^LANES, so a
change moves it by h(new) - h(old): both ends of a weight sync keep their state's hash current in
O(changes) (`change_sum`), whatever the order of the changes or the sharding (Bellare and
Micciancio's incremental hashing; Lewi et al.'s lane-vector LtHash, IACR ePrint 2019/227).
The element hash is two splitmix64 rounds per lane with BLAKE2b-derived per-tensor keys,
vectorised with numpy: collisions from errors chosen without the key have probability 2^-128
(as the xxh3-128 state hash beside it, hashing.py). Like xxh3 it does not resist an adversary;
LtHash16's cryptographic parameters would, at a cost numpy cannot pay at memory speed
(benchmarks/weight_sync.py --sections lthash measures both).
Not covered: hashing a whole state at memory speed (`state_sum` is for tests; sync.py keeps the
sum relative to an anchor checked with xxh3).
"""

from __future__ import annotations

import functools
import hashlib

import numpy as np
import xxhash

from traingym.weights import native

LANES = 2
KEY = b"traingym-lthash-v1"
CHUNK = 1 << 14  # elements per numpy batch: the temporaries stay in L1/L2
_M1, _M2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)
_S30, _S27, _S31 = np.uint64(30), np.uint64(27), np.uint64(31)
_FITS = 1 << 32  # positions below this pack beside a value of up to 32 bits


def zero() -> np.ndarray:
    return np.zeros(LANES, np.uint64)


@functools.lru_cache(maxsize=1 << 14)
def tensor_keys(name: str) -> np.ndarray:
    """(LANES, 3) uint64 keys of one tensor: two per lane, and one for mixing positions."""
    raw = hashlib.blake2b(name.encode(), key=KEY, digest_size=8 * 3 * LANES).digest()
    k = np.frombuffer(raw, np.uint64).reshape(LANES, 3).copy()
    k.setflags(write=False)
    return k


def _mix(z: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser, in place on a fresh array."""
    z ^= z >> _S30
    z *= _M1
    z ^= z >> _S27
    z *= _M2
    z ^= z >> _S31
    return z


def _words(keys: np.ndarray, pos: np.ndarray, v: np.ndarray, packed: bool) -> np.ndarray:
    p = pos.astype(np.uint64)
    if packed:
        return (p << np.uint64(32)) | v.astype(np.uint64)
    return _mix(p + keys[0, 2]) ^ v.astype(np.uint64)


def packs(width: int, numel: int) -> bool:
    """Whether an element of `width` bytes packs beside its position into one word."""
    return width <= 4 and numel <= _FITS


def element_sum(name: str, numel: int, pos: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Sum of h(name, pos[i], v[i]) (v: the elements' bits as unsigned ints; pos: flat
    positions in a tensor of `numel` elements)."""
    keys = tensor_keys(name)
    packed = packs(v.dtype.itemsize, numel)
    out = zero()
    for i in range(0, pos.size, CHUNK):
        x = _words(keys, pos[i : i + CHUNK], v[i : i + CHUNK], packed)
        for lane in range(LANES):
            y = _mix(x ^ keys[lane, 0])
            y += keys[lane, 1]
            out[lane : lane + 1] += _mix(y).sum(dtype=np.uint64, keepdims=True)
    return out


def change_sum(name: str, numel: int, pos: np.ndarray, old: np.ndarray,
               new: np.ndarray) -> np.ndarray:
    """How the hash moves when tensor `name` changes from old[i] to new[i] at pos[i]."""
    if native.lib is not None:
        return native.change_sum(tensor_keys(name), packs(old.dtype.itemsize, numel), pos, old,
                                 new)
    return element_sum(name, numel, pos, new) - element_sum(name, numel, pos, old)


def state_sum(state) -> np.ndarray:
    """The hash of a whole state from scratch (every element): for tests and checks."""
    from traingym.weights.hashing import bits  # heavy: torch

    out = zero()
    for name in sorted(state):
        b = bits(state[name])
        out += element_sum(name, b.size, np.arange(b.size, dtype=np.int64), b)
    return out


def identity(anchor_hash: str, since_anchor: np.ndarray) -> str:
    """The hash a chain names a delta's target by: the anchor's full (xxh3) hash and the
    additive hash's movement since that anchor, hashed together (32 hex digits)."""
    return xxhash.xxh3_128(anchor_hash.encode() + since_anchor.astype("<u8").tobytes()).hexdigest()
