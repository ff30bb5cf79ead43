"""Where a delta sync's time goes, per phase, as the model grows: the `scaling` and `lthash`
sections of benchmarks/weight_sync.py (run them from there; results for BENCHMARKS.md).

    python benchmarks/weight_sync.py --sections scaling,lthash --steps 3 --tilings 1,4,16
        # -> benchmarks/results/weight_sync_scaling/<date>-<commit>.json (a run of only this
        #    file's sections, scaling, lthash and tier, is this benchmark; --label names a variant)
    python benchmarks/weight_sync.py --model tiny --sections scaling,lthash --steps 2 \\
        --tilings 1,4,16 --repeat 2 --out /tmp/ws_smoke.json          # a smoke, seconds

scaling: one real step of the model (old -> new bf16 states, the step closest to 1% changed)
is tiled k times (tensor "i.name" is copy i) for each k in --tilings, in two series:
  same_density: every copy takes the step's change (changes grow with k, density stays);
  same_changes: only copy 0 changes (the changes stay, the model grows k times).
With --cast first,fused (same density) the sender starts from fp32 masters (the bf16 values
widened) as a trainer does: "first" casts a bf16 copy (timed as cast) and then finds the
changes; "fused" lets the publisher find them in the cast's own pass (Publisher.publish's
`cast`). Masters cost 2 x the bf16 state more memory: leave them out at 16x on 24 GB.
A Publisher sends an anchor, then deltas that alternate old <-> new (each the same change),
to a Subscriber through an in-memory pipe that serialises each frame (`to_bytes`, a copy,
as a socket write would) and parses it on the other side (`from_buffer`, no copy); the
periodic full hash is off (full_hash_every=0; `full_hash_s` is what one costs). Per delta:
  sender:   extract (find the changed elements: a pass over old and new), code (entropy
            coding), verify (the additive hash's movement from the changes), seal (frame
            header, body hash), transfer (serialise), apply (the shadow's changed elements);
  receiver: transfer (parse + body hash check), decode (streams -> positions and values,
            including the old values' gather), apply (the writes), verify (the additive
            hash's movement and the chain hash compare).
With --threads > 1 the per-phase figures are summed over threads (CPU seconds); `wall` is
each side's elapsed time. Medians over --repeat deltas. Each tiling also records its first
(anchor) send: encode (a copy) + xxh3 on the sender, the receiver's copy into fresh tensors +
xxh3, handed over in memory (not serialised, unlike the deltas).
Memory: the tiled state, the publisher's shadow and the subscriber's copy (3 x k x 269 MB
for the embedded model: 16x needs about 13 GB, and about 4 GB more while the first anchor's
payload is alive; the machine must have about 18 GB free).
lthash: ns per element of the additive hash (lthash.element_sum) at several batch sizes, and
for reference one BLAKE2b call and one LtHash16-sized SHAKE-128 expansion (2 KB) per element
from Python, and xxh3 over a bf16 state per element.
"""

from __future__ import annotations

import hashlib
import statistics
import time
from collections import deque

import numpy as np

from traingym.weights import lthash
from traingym.weights.base import Payload, PeerDead, TransportTimeout
from traingym.weights.extract import changes
from traingym.weights.frame import from_buffer, to_bytes
from traingym.weights.hashing import bits, state_hash
from traingym.weights.sync import Publisher, PublisherConfig, Subscriber, SubscriberConfig


class Pipe:
    """Sender and receiver in one: delta frames go through bytes, as over a socket, without
    one; anchors are handed over as objects (a serialised copy of a 16x state would not fit
    beside the others in 24 GB). Keeps no chain (a benchmark never resyncs; a fault raises)."""

    def __init__(self) -> None:
        self.frames: deque = deque()

    def send(self, payload) -> None:
        self.frames.append(payload if payload.is_anchor else to_bytes(payload))

    def receive(self, timeout: float):
        if not self.frames:
            raise TransportTimeout("nothing sent")
        frame = self.frames.popleft()
        return frame if isinstance(frame, Payload) else from_buffer(frame)

    def resync(self, have_hash) -> None:
        raise PeerDead("the benchmark's pipe cannot resync: an update failed verification")

    def close(self) -> None:
        pass


def _flip(big: dict, diff: dict, copies: range, to_new: bool, masters: dict | None) -> None:
    """Write the step's change into each copy in `copies` (or undo it); into the fp32
    masters too (as the bf16 values widened), when there are masters."""
    for name, (pos, a_pos, b_pos) in diff.items():
        vals = b_pos if to_new else a_pos
        for i in copies:
            bits(big[f"{i}.{name}"])[pos] = vals
            if masters is not None:
                t = big[f"{i}.{name}"].reshape(-1)
                masters[f"{i}.{name}"].reshape(-1)[pos] = t[pos].float()


def _median(rows: list[dict]) -> dict:
    return {k: statistics.median(r.get(k, 0.0) for r in rows) for k in rows[0]}


def run_tiling(old, new, copies: int, series: str, repeat: int, threads: int,
               cast_mode: str = "none") -> dict:
    diff = {}
    for name in old:
        pos, a_pos, b_pos = changes(bits(old[name]), bits(new[name]))
        if pos.size:
            diff[name] = (pos, a_pos, b_pos)
    big = {f"{i}.{k}": v.clone() for i in range(copies) for k, v in old.items()}
    model_bytes = sum(t.numel() * t.element_size() for t in big.values())
    masters = {k: v.float() for k, v in big.items()} if cast_mode != "none" else None
    cast = next(iter(big.values())).dtype
    pipe = Pipe()
    pub = Publisher(pipe, PublisherConfig(codec="delta", anchor_budget=1e9, full_hash_every=0,
                                          threads=threads))
    sub = Subscriber(pipe, SubscriberConfig(threads=threads))
    t0 = time.perf_counter()
    stats = pub.publish(big, 0)
    t1 = time.perf_counter()
    sub.poll(0)
    t2 = time.perf_counter()
    full = {"sender_s": t1 - t0, "encode_s": stats.encode_s, "receiver_s": t2 - t1,
            "bytes": stats.payload_bytes}
    t0 = time.perf_counter()
    state_hash(big)
    full_hash_s = time.perf_counter() - t0
    which = range(copies) if series == "same_density" else range(1)
    rows = []
    for v in range(1, repeat + 1):
        _flip(big, diff, which, v % 2 == 1, masters)
        t0 = time.perf_counter()
        cast_s = 0.0
        if cast_mode == "fused":  # the publisher casts the masters, finding changes as it goes
            stats = pub.publish(masters, v, cast=cast)
        elif cast_mode == "first":  # the loop before: cast a copy, then find the changes
            wire = {k: m.to(cast) for k, m in masters.items()}
            cast_s = time.perf_counter() - t0
            stats = pub.publish(wire, v)
            del wire
        else:  # bf16 states given: no cast timed
            stats = pub.publish(big, v)
        t1 = time.perf_counter()
        assert sub.poll(0) and sub.hash == pub.hash, "the receiver did not verify the delta"
        t2 = time.perf_counter()
        ph, rp = stats.phases, sub.phases
        rows.append({
            "changed": stats.changed, "bytes": stats.payload_bytes,
            "sender_wall_s": t1 - t0, "sender_cast_s": cast_s,
            "sender_extract_s": ph.get("extract", 0.0), "sender_code_s": ph.get("code", 0.0),
            "sender_verify_s": ph.get("verify", 0.0),
            "sender_seal_s": max(0.0, stats.encode_s - sum(ph.get(k, 0.0) for k in
                                                           ("extract", "code", "verify"))),
            "sender_transfer_s": stats.send_s, "sender_apply_s": ph.get("shadow", 0.0),
            "receiver_wall_s": t2 - t1,
            "receiver_transfer_s": max(0.0, (t2 - t1) - sum(rp.values())),
            "receiver_decode_s": rp.get("decode", 0.0), "receiver_apply_s": rp.get("apply", 0.0),
            "receiver_verify_s": rp.get("verify", 0.0) + rp.get("check", 0.0),
        })
    assert state_hash(sub.state) == state_hash(big) == pub.full_hash()
    med = _median(rows)
    med["ns_per_changed"] = {side: 1e9 * med[f"{side}_wall_s"] / max(med["changed"], 1)
                             for side in ("sender", "receiver")}
    return {"copies": copies, "series": series, "model_bytes": model_bytes,
            "density": med["changed"] / (model_bytes / 2), "threads": threads, "cast": cast_mode,
            "full_send": full, "full_hash_s": full_hash_s, "median": med, "steps": rows}


def section_scaling(old, new, tilings: list[int], repeat: int, threads: int,
                    cast_modes: list[str]) -> dict:
    out = []
    for series, mode in [("same_density", "none"), ("same_changes", "none"),
                         *(("same_density", c) for c in cast_modes if c != "none")]:
        for k in tilings:
            if series == "same_changes" and k == 1:
                continue  # the same run as same_density at 1x
            r = run_tiling(old, new, k, series, repeat, threads, mode)
            m = r["median"]
            print(f"  {series:12s} cast={mode:5s} {k:2d}x  {r['model_bytes'] / 1e9:6.2f} GB  changed "
                  f"{int(m['changed']):>9d} ({r['density']:.4f})  sender {m['sender_wall_s']:.3f}s"
                  f" [cast {m['sender_cast_s']:.3f} extract {m['sender_extract_s']:.3f} code {m['sender_code_s']:.3f} verify "
                  f"{m['sender_verify_s']:.3f} seal {m['sender_seal_s']:.3f} transfer "
                  f"{m['sender_transfer_s']:.3f} apply {m['sender_apply_s']:.3f}]  receiver "
                  f"{m['receiver_wall_s']:.3f}s [transfer {m['receiver_transfer_s']:.3f} decode "
                  f"{m['receiver_decode_s']:.3f} apply {m['receiver_apply_s']:.3f} verify "
                  f"{m['receiver_verify_s']:.3f}]  full send {r['full_send']['sender_s']:.2f}"
                  f"+{r['full_send']['receiver_s']:.2f}s, full hash {r['full_hash_s']:.3f}s",
                  flush=True)
            out.append(r)
    return {"threads": threads, "repeat": repeat, "runs": out}


def section_lthash(state) -> dict:
    rng = np.random.default_rng(0)
    res = {"lanes": lthash.LANES, "element_sum_ns": {}}
    for n in (1 << 10, 1 << 14, 1 << 18, 1 << 21):
        pos = np.sort(rng.choice(1 << 26, n, replace=False))
        v = rng.integers(0, 1 << 16, n).astype(np.uint16)
        best = min(_timed(lambda: lthash.element_sum("w", 1 << 26, pos, v)) for _ in range(3))
        res["element_sum_ns"][n] = 1e9 * best / n
    items = [i.to_bytes(8, "little") + b"\x12\x34" for i in range(20000)]
    res["blake2b_per_element_ns"] = 1e9 * _timed(
        lambda: [hashlib.blake2b(x, digest_size=16).digest() for x in items]) / len(items)
    few = items[:2000]
    res["shake128_2KB_per_element_ns"] = 1e9 * _timed(
        lambda: [np.frombuffer(hashlib.shake_128(x).digest(2048), np.uint16) for x in few]
    ) / len(few)
    n = sum(t.numel() for t in state.values())
    res["xxh3_state_ns_per_element"] = 1e9 * min(_timed(lambda: state_hash(state))
                                                 for _ in range(3)) / n
    print("  " + "  ".join(f"{k} {v}" for k, v in res.items()), flush=True)
    return res


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def section_tier(old, new, copies: int, repeat: int) -> dict:
    """The tiered method's split against no split, per delta of the state tiled `copies`
    times (same density), one thread: "tier" (the encoder's choice with the link unknown:
    fewest bytes), "no tier" (threshold 0 everywhere: a link so fast that no split pays) and
    "sparse" (the older method, tiered's formats switched off). Each round codes the step
    both ways (old -> new, new -> old) and applies both to one receiver state, variants in
    turn; medians. `list_s_per_element`: what the split costs both sides per element of the
    state (tier minus no tier, sender plus receiver), the figure tiered.LIST_S records."""
    from traingym.weights import tiered
    from traingym.weights.codecs import DeltaCodec, apply_changes

    big_old = {f"{i}.{k}": v.clone() for i in range(copies) for k, v in old.items()}
    big_new = {f"{i}.{k}": v.clone() for i in range(copies) for k, v in new.items()}
    recv = {k: v.clone() for k, v in big_old.items()}
    elements = sum(t.numel() for t in big_old.values())
    variants = {"tier": None, "no tier": 1e-15, "sparse": None}
    rows: dict[str, list[dict]] = {v: [] for v in variants}
    codec, bits_of = DeltaCodec(), tiered.MANTISSA_BITS
    for _ in range(repeat):
        for name, link in variants.items():
            tiered.MANTISSA_BITS = {} if name == "sparse" else bits_of
            try:
                row = {"bytes": 0, "sender_s": 0.0, "code_s": 0.0, "receiver_s": 0.0,
                       "changed": 0, "methods": {}}
                for src, dst in ((big_old, big_new), (big_new, big_old)):
                    t0 = time.perf_counter()
                    payload, sent = codec.encode_changes(src, dst, link_s_per_byte=link)
                    t1 = time.perf_counter()
                    _, got = apply_changes(recv, payload)
                    t2 = time.perf_counter()
                    assert np.array_equal(got.sum, sent.sum), "receiver and sender disagree"
                    row["bytes"] += payload.nbytes / 2
                    row["sender_s"] += (t1 - t0) / 2
                    row["code_s"] += sent.times.get("code", 0.0) / 2
                    row["receiver_s"] += (t2 - t1) / 2
                    row["changed"] += sent.n_changed / 2
                    for e in payload.header.tensors:
                        m = e.method + (" T=0" if e.method == "tiered" and not e.params[0] else "")
                        row["methods"][m] = row["methods"].get(m, 0) + 1
            finally:
                tiered.MANTISSA_BITS = bits_of
            rows[name].append(row)
    assert state_hash(recv) == state_hash(big_old), "the receiver drifted"
    med = {name: {**_median([{k: v for k, v in r.items() if k != "methods"} for r in rs]),
                  "methods": rs[0]["methods"]} for name, rs in rows.items()}
    extra = (med["tier"]["sender_s"] - med["no tier"]["sender_s"]
             + med["tier"]["receiver_s"] - med["no tier"]["receiver_s"])
    saved = med["no tier"]["bytes"] - med["tier"]["bytes"]
    out = {"copies": copies, "elements": elements, "repeat": repeat, "median": med,
           "rows": rows, "list_s_per_element": extra / elements,
           "bytes_saved_by_tier": saved,
           "break_even_link_MB_per_s": saved / extra / 1e6 if extra > 0 else None}
    for name, m in med.items():
        print(f"  {name:8s} {m['bytes'] / 1e6:6.2f} MB  sender {m['sender_s']:.3f}s (code "
              f"{m['code_s']:.3f})  receiver {m['receiver_s']:.3f}s  {m['methods']}", flush=True)
    print(f"  the split costs {1e9 * out['list_s_per_element']:.3f} ns per element (both "
          f"sides), saves {saved / 1e6:.2f} MB: worth it below "
          f"{out['break_even_link_MB_per_s'] or 0:.1f} MB/s", flush=True)
    return out
