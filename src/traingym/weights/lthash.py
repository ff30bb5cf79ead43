"""An additive (homomorphic) hash of a state, updated from its changes alone.

The hash of a state is the sum, over every element, of an element hash h(name, position,
value bits) in (Z_2^64)^LANES. A change at one position from value u to v moves the sum by
h(name, pos, v) - h(name, pos, u), so both ends of a weight sync keep the hash of their state
current in O(changes) (`change_sum`): the sender from the changes it extracted, the receiver
from the ones it applied (the old values it read, the new ones it wrote). Sums commute, so
the order of the changes, and how the state is split into shards, do not matter. This is
the incremental hashing paradigm of Bellare and Micciancio ("A new paradigm for
collision-free hashing: incrementality at reduced cost", EUROCRYPT 1997: AdHash, and the
lattice hash LtHash), in the lane-vector form Lewi et al. deployed ("Securing update
propagation with homomorphic hashing", Facebook, IACR ePrint 2019/227: LtHash16, 1024 lanes
of 16 bits, summed lane-wise).

Element hash. Each tensor name gets two 64-bit keys per lane from BLAKE2b (keyed with
`KEY`); an element's position and value bits are packed into one 64-bit word (injective for
elements of up to 4 bytes in tensors of up to 2^32 elements; otherwise the position is mixed
first, and two pairs coincide with probability 2^-64), and each lane is two rounds of the
splitmix64 finaliser (a bijection on 64 bits) with the lane's keys added between them,
vectorised with numpy over batches of positions (`CHUNK` at a time, in cache).

Collision bound, for errors chosen without the key (corruption, loss, reordering, bugs): if
the element hash were a random function, two states that differ in any set of positions
differ by a sum of +-h over distinct (position, value) pairs, each with coefficient +-1, which
is uniform in (Z_2^64)^LANES: equal hashes with probability 2^-(64 * LANES) = 2^-128 (the
bound of the xxh3-128 state hash it stands beside, hashing.py). The splitmix rounds are not a
cryptographic PRF, so, like xxh3, this does not resist an adversary who picks the corruption
knowing the function (authenticate the channel for that). Resisting one is what LtHash16's
parameters buy (Lewi et al. 2019, section 4: n = 1024 lanes mod 2^16, about 200 bits of
security from the short-integer-solution problem, with a cryptographic XOF per element):
2 KB of BLAKE2b/SHAKE output per element, which numpy cannot make at anything near memory
speed (benchmarks/weight_sync.py --sections lthash measures both).

Cost (the project's 2-core machine, heavily loaded by other jobs, one thread, CPU time;
benchmarks/weight_sync.py --sections lthash and /tmp scripts, 2026-12-03): about 12 ns per
element hashed in batches of 2^14 to 2^21, so about 24 ns per changed element (its old and
new value); xxh3 over a bf16 state is about 0.13 ns per element. At about 1% changed the
incremental check thus costs about what the two full hashes per delta it replaces did (the
base re-hash and the target hash), less below that, and it follows the changes, not the
model. From Python, one BLAKE2b call per element took about 1.7 us and an LtHash16-sized
SHAKE-128 expansion (2 KB) about 27 us: 70x and 1100x the hash used here. With the C
kernels (native.py: the same sums), `change_sum` and the receiver's fused apply hash each
element in a plain loop: benchmarks/weight_sync.py --sections scaling reports the verify
phase per changed element (BENCHMARKS.md).

Not covered: the hash of a whole state from scratch at memory speed (`state_sum` is for tests
and checks; the sync starts every chain from an anchor checked with xxh3 and keeps the sum
relative to it, see sync.py).
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
