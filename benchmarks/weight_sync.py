"""Weight-sync benchmark on real RL updates. Results for BENCHMARKS.md ("## Weight sync").

    python benchmarks/weight_sync.py        # compress,throughput,tcp
        # -> benchmarks/results/weight_sync/<date>-<commit>.json
    python benchmarks/weight_sync.py --sections compress,throughput --steps 20
        # -> benchmarks/results/weight_sync/<date>-<commit>-compress-throughput.json
    python benchmarks/weight_sync.py --sections tcp --threads 2 --label tcp_t2
    python benchmarks/weight_sync.py --sections scaling,lthash --steps 3 --tilings 1,4,16
        # per-phase times as it grows -> benchmarks/results/weight_sync_scaling/
    python benchmarks/weight_sync.py --model tiny --sections scaling,lthash --steps 2 \
        --tilings 1,4 --repeat 2 --out /tmp/ws_smoke.json                      # smoke, seconds

Each run writes a new result file with its provenance (benchmarks/resultfile.py). A run of only
weight_sync_scaling.py's sections (scaling, lthash, tier) is benchmark `weight_sync_scaling`,
any other `weight_sync`; there, a run of other than the default sections is labelled with them
(joined by '-') unless --label says otherwise.

Sections:
  compress    SmolLM2-135M (the embedded model, fp32 master weights), AdamW at an RL learning
              rate on a policy-gradient surrogate, bf16 state after every step: changed
              fraction; bytes per changed element and ratio to full for full, int32 positions
              + raw values, XOR + zstd, traingym delta (streams, and the whole frame with
              its JSON header and padding); two entropy floors (below); the methods used.
  throughput  encode and decode+apply in GB/s of model bytes, one thread, next to memcpy,
              best of --repeat runs, in wall time and in CPU time, with the load average
              before and after (the machines are shared).
  tcp         1 GB bf16 state (the 135M state tiled 4x, with a real step's delta) over TCP:
              through a 1 Gbit/s link, and over unlimited loopback; full against delta,
              receiver-verified; what "auto" picks. The link (--link): a veth pair into a
              network namespace with `tc tbf rate 1gbit` (needs root and `ip netns`), or a
              rate-limited loopback relay (token bucket, this process) where namespaces are
              unavailable; `auto` (default) tries the namespace first. Sends v0 full, v1
              delta, v2 full, v3 auto, v4 and v5 delta; `median_delta_s` is the median of
              the three deltas (v1, v4, v5). --threads: the publisher's and subscriber's.
  scaling     per delta, the sender's and receiver's time in change extraction, coding,
              transfer, verification and apply, for the model and its state tiled
              --tilings times, at the same density and at the same number of changes
              (benchmarks/weight_sync_scaling.py says how). --model tiny: a smoke in seconds.
  lthash      ns per element of the incremental hash, beside BLAKE2b, SHAKE and xxh3.
  tier        the tiered method's split against no split (threshold 0) and "sparse", for
              the state tiled --copies times: bytes, each side's time, and what the split
              costs per element of the state (tiered.LIST_S; weight_sync_scaling.py).
Entropy floors, per tensor: "floor" is N*H(n/N) bits for which elements changed plus n times
the empirical entropy of the key differences (positions independent, values i.i.d.: the
zeroth order). "floor_exp" conditions both on the old bf16 exponent, which the receiver
holds: each exponent's elements change with their own probability, and the key differences
are coded given the exponent (what a context coder over that one context could reach; the
codec's "tiered" method uses a coarser form of it, so it lands between the two floors).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import resultfile

os.environ.setdefault("OMP_NUM_THREADS", "1")
import numpy as np  # noqa: E402
import torch  # noqa: E402
import zstandard  # noqa: E402

torch.set_num_threads(1)
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # realistic_weights
from traingym.weights import entropy, tiered  # noqa: E402
from traingym.weights.codecs import DeltaCodec, apply  # noqa: E402
from traingym.weights.extract import changed_positions, changes  # noqa: E402
from traingym.weights.frame import frame_size, seal  # noqa: E402
from traingym.weights.hashing import bits, state_hash  # noqa: E402

MODEL_DIR = Path.home() / ".cache/traingym/models/smollm2-135m-instruct"
SECTIONS = "compress,throughput,tcp"  # the default
SCALING_SECTIONS = {"scaling", "lthash", "tier"}  # weight_sync_scaling.py's: its own results


def tiny_stream(steps: int, lr: float):
    """A tiny Llama's bf16 states (tests/realistic_weights.py): for smokes of the timed sections."""
    from realistic_weights import rl_states, tiny_llama

    return [{k: v for k, v in s.items() if k != "lm_head.weight"}
            for s in rl_states(tiny_llama(hidden=256, layers=4, vocab=4096), steps, lr=lr)]


def rl_stream(steps: int, lr: float, cache: str | None = None):
    """The bf16 states of `steps` AdamW steps (plus the initial one). With `cache`, states
    are saved there as safetensors on the first run and loaded on later runs (same lr and
    steps only: the stream is deterministic, the file names carry both)."""
    if cache:
        from safetensors.torch import load_file, save_file

        files = [Path(cache) / f"lr{lr:g}_step{i}.safetensors" for i in range(steps + 1)]
        if all(f.exists() for f in files):
            return [load_file(f) for f in files]
        states = rl_stream(steps, lr)
        Path(cache).mkdir(parents=True, exist_ok=True)
        for f, s in zip(files, states):
            save_file(s, f)
        return states
    from transformers import AutoModelForCausalLM

    from realistic_weights import rl_states

    model = AutoModelForCausalLM.from_pretrained(MODEL_DIR, dtype=torch.float32)
    model.config.tie_word_embeddings = True
    t0 = time.perf_counter()
    states = []
    for s in rl_states(model, steps, lr=lr, batch=2, seq=48):
        states.append({k: v for k, v in s.items() if k != "lm_head.weight"})  # tied
        print(f"  step {len(states) - 1}: {time.perf_counter() - t0:.0f}s", flush=True)
    return states


def _entropy_bits(x: np.ndarray) -> float:
    _, counts = np.unique(x, return_counts=True)
    p = counts / counts.sum()
    return float(-(counts * np.log2(p)).sum())


def _h(p: np.ndarray) -> np.ndarray:
    p = np.clip(p, 1e-300, 1 - 1e-16)
    return np.where((p <= 1e-300) | (p >= 1 - 1e-16), 0.0,
                    -(p * np.log2(p) + (1 - p) * np.log2(1 - p)))


def step_sizes(old, new) -> dict:
    """Bytes of one step's update under each scheme, and two entropy floors."""
    zc = zstandard.ZstdCompressor(level=3)
    n = total = xor_bytes = 0
    floor_bits = floor_exp_bits = 0.0
    for k in old:
        a, b = bits(old[k]), bits(new[k])
        pos = changed_positions(a, b)
        total += a.size
        n += pos.size
        xor_bytes += len(zc.compress((a ^ b).tobytes()))
        if pos.size:
            floor_bits += a.size * float(_h(np.array(pos.size / a.size)))
            d = (entropy.float_key(b[pos]) - entropy.float_key(a[pos])).view(np.int16)
            floor_bits += _entropy_bits(d)
            e = ((a & np.uint16(0x7FFF)) >> np.uint16(7)).astype(np.int64)  # old bf16 exponent
            count, hits = np.bincount(e, minlength=256), np.bincount(e[pos], minlength=256)
            floor_exp_bits += float((count * _h(hits / np.maximum(count, 1))).sum())
            pair = e[pos] * 65536 + d.view(np.uint16)
            floor_exp_bits += _entropy_bits(pair) - _entropy_bits(e[pos])
    payload = DeltaCodec().encode(old, new)
    full = total * 2
    return {"elements": total, "changed": n, "density": n / total, "full": full,
            "int32_raw": n * 6, "xor_zstd": xor_bytes, "traingym": payload.nbytes,
            "traingym_frame": frame_size(seal(payload)), "floor": floor_bits / 8,
            "floor_exp": floor_exp_bits / 8,
            "methods": dict(Counter(e.method for e in payload.header.tensors))}


def section_compress(states) -> dict:
    rows = [step_sizes(a, b) for a, b in zip(states, states[1:])]
    for i, r in enumerate(rows, 1):
        print(f"  step {i:2d}: density {r['density']:.4f}  "
              + "  ".join(f"{m} {r[m] / max(r['changed'], 1):.3f}B/ch"
                          for m in ("int32_raw", "xor_zstd", "traingym", "traingym_frame",
                                    "floor", "floor_exp"))
              + f"  full/tg {r['full'] / r['traingym']:.0f}x  xor/tg "
              f"{r['xor_zstd'] / r['traingym']:.2f}x  tg/floor_exp "
              f"{r['traingym'] / r['floor_exp']:.3f}  {r['methods']}", flush=True)
    return {"steps": rows}


def _best(fn, repeat: int = 3) -> tuple[float, float]:
    """(best wall time, best CPU time) of `repeat` runs."""
    wall, cpu = [], []
    for _ in range(repeat):
        t0, c0 = time.perf_counter(), time.process_time()
        fn()
        wall.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    return min(wall), min(cpu)


def section_throughput(old, new, repeat: int = 5) -> dict:
    load_before = os.getloadavg()
    model_bytes = sum(t.numel() * t.element_size() for t in new.values())
    big = np.random.default_rng(0).integers(0, 255, 256 << 20, dtype=np.uint8)
    dst = np.empty_like(big)
    codec = DeltaCodec()
    payload = codec.encode(old, new)
    work = {k: v.clone() for k, v in old.items()}

    def reset():
        for k, v in old.items():
            bits(work[k])[:] = bits(v)

    def decode():  # the reset (a copy of the state) is timed too, then subtracted
        reset()
        apply(work, payload)

    pairs = [(bits(old[k]), bits(new[k])) for k in sorted(new)]
    tiers = [(bits(old[e.name]), e.params[0] << tiered.MANTISSA_BITS[old[e.name].dtype])
             for e in payload.header.tensors if e.method == "tiered"]
    timed = {"memcpy": lambda: np.copyto(dst, big), "reset": reset,
             "pass_changed": lambda: [changes(a, b) for a, b in pairs],
             "pass_small": lambda: [tiered.small_positions(a, bound) for a, bound in tiers],
             "encode": lambda: codec.encode(old, new), "decode": decode,
             "hash": lambda: state_hash(new)}
    best = {k: [float("inf"), float("inf")] for k in timed}
    for _ in range(repeat):  # interleaved, so that noise falls on all of them alike
        for k, fn in timed.items():
            w, c = _best(fn, 1)
            best[k] = [min(best[k][0], w), min(best[k][1], c)]
    reset()
    apply(work, payload)
    assert state_hash(work) == state_hash(new)
    out = {"model_bytes": model_bytes, "repeat": repeat, "load_before": load_before,
           "load_after": os.getloadavg(),
           "density": sum(e.n_changed for e in payload.header.tensors) / (model_bytes / 2)}
    out["encode_passes_s_cpu"] = {"changed_words": best["pass_changed"][1],
                                  "small_magnitudes": best["pass_small"][1]}
    print(f"  encode's two passes (CPU s): changed words {best['pass_changed'][1]:.3f}, "
          f"small magnitudes {best['pass_small'][1]:.3f} (the decoder makes the second)",
          flush=True)
    for i, clock in enumerate(("wall", "cpu")):
        enc, h = best["encode"][i], best["hash"][i]
        dec = best["decode"][i] - best["reset"][i]
        out[clock] = {"memcpy_GBps": big.nbytes / best["memcpy"][i] / 1e9,
                      "encode_GBps": model_bytes / enc / 1e9,
                      "decode_apply_GBps": model_bytes / dec / 1e9,
                      "hash_GBps": model_bytes / h / 1e9,
                      "encode_with_hash_GBps": model_bytes / (enc + h) / 1e9,
                      "decode_with_2_hashes_GBps": model_bytes / (dec + 2 * h) / 1e9}
        print(f"  {clock:4s} " + "  ".join(f"{k} {v:.3g}" for k, v in out[clock].items()),
              flush=True)
    print(f"  density {out['density']:.4f}  load average before {load_before[0]:.2f}, "
          f"after {out['load_after'][0]:.2f}", flush=True)
    return out


# ---------------------------------------------------------------- tcp end to end
NS, VETH_HOST, VETH_NS = "tgws-bench", "tgws0", "tgws1"
HOST_IP, NS_IP = "10.231.7.1", "10.231.7.2"


def _sh(*cmd: str) -> None:
    subprocess.run(cmd, check=True)


def netns_up(rate: str) -> None:
    _sh("ip", "netns", "add", NS)
    _sh("ip", "link", "add", VETH_HOST, "type", "veth", "peer", "name", VETH_NS)
    _sh("ip", "link", "set", VETH_NS, "netns", NS)
    _sh("ip", "addr", "add", f"{HOST_IP}/30", "dev", VETH_HOST)
    _sh("ip", "link", "set", VETH_HOST, "up")
    _sh("ip", "netns", "exec", NS, "ip", "addr", "add", f"{NS_IP}/30", "dev", VETH_NS)
    _sh("ip", "netns", "exec", NS, "ip", "link", "set", VETH_NS, "up")
    _sh("ip", "netns", "exec", NS, "ip", "link", "set", "lo", "up")
    for dev, pre in ((VETH_HOST, []), (VETH_NS, ["ip", "netns", "exec", NS])):
        _sh(*pre, "tc", "qdisc", "add", "dev", dev, "root", "tbf", "rate", rate,
            "burst", "1mb", "latency", "100ms")


def netns_down() -> None:
    """Remove what netns_up made; quiet when there is nothing to remove."""
    quiet = {"check": False, "stderr": subprocess.DEVNULL}
    subprocess.run(["ip", "link", "del", VETH_HOST], **quiet)
    subprocess.run(["ip", "netns", "del", NS], **quiet)


class RateLimitedRelay:
    """A loopback TCP relay that forwards the sender -> receiver direction at `rate` bytes/s
    (token bucket, 1 MB burst) and the other direction unlimited: the link for machines where
    network namespaces (`ip netns`, root) are unavailable. Receivers connect to `port`."""

    def __init__(self, target_port: int, rate: float, burst: int = 1 << 20):
        self.target_port, self.rate, self.burst = target_port, rate, burst
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return  # closed
            upstream = socket.create_connection(("127.0.0.1", self.target_port))
            threading.Thread(target=self._pump, args=(upstream, client, self.rate),
                             daemon=True).start()
            threading.Thread(target=self._pump, args=(client, upstream, None),
                             daemon=True).start()

    def _pump(self, src, dst, rate) -> None:
        tokens, last = float(self.burst), time.monotonic()
        buf = bytearray(256 << 10)
        while True:
            try:
                n = src.recv_into(buf)
            except OSError:
                n = 0
            if n == 0:
                for s in (src, dst):
                    s.close()
                return
            if rate is not None:
                now = time.monotonic()
                tokens = min(self.burst, tokens + (now - last) * rate)
                last = now
                if tokens < n:
                    time.sleep((n - tokens) / rate)
                    tokens, last = n, time.monotonic()
                tokens -= n
            try:
                dst.sendall(memoryview(buf)[:n])
            except OSError:
                return

    def close(self) -> None:
        self.listener.close()


def netns_available() -> bool:
    netns_down()
    try:
        netns_up("1gbit")
    except (subprocess.CalledProcessError, FileNotFoundError):
        return False
    finally:
        netns_down()
    return True


def tiled(state, copies: int):
    return {f"{i}.{k}": v.clone() for i in range(copies) for k, v in state.items()}


def receiver_main(host: str, port: int, versions: int, threads: int) -> None:
    from traingym.weights.sync import Subscriber, SubscriberConfig
    from traingym.weights.tcp import TcpConfig, TcpReceiver

    sub = Subscriber(TcpReceiver(TcpConfig(host=host, port=port, connect_timeout_s=60,
                                           dead_after_s=60)),
                     SubscriberConfig(threads=threads))
    for v in range(versions):
        sub.wait_for(v, 300)
        print(json.dumps({"version": sub.version, "t": time.time(),
                          "hash": sub.hash}), flush=True)


def reported_changes(old, new) -> tuple[dict, dict, dict]:
    """Per tensor, the flat positions where the two bf16 states differ and the bits there in
    each: what the trainer's optimizer step reports (trainer/step_changes.py) for a step
    between them, computed here before the timing (its cost inside the step:
    benchmarks/step_changes.py)."""
    found = {k: changes(bits(old[k]), bits(new[k])) for k in old}
    return tuple({k: f[i] for k, f in found.items()} for i in range(3))


def run_link(old, new, host_bind: str, connect_to: str, netns: bool,
             relay_rate: float | None = None, threads: int = 1, changed: bool = False) -> dict:
    from traingym.weights.base import Changed
    from traingym.weights.sync import Publisher, PublisherConfig
    from traingym.weights.tcp import TcpConfig, TcpSender

    sender = TcpSender(TcpConfig(host=host_bind, send_timeout_s=300))
    relay = RateLimitedRelay(sender.port, relay_rate) if relay_rate else None
    port = relay.port if relay else sender.port
    # v0 full (anchor), v1 delta, v2 full again (codec=full), v3 auto, v4 and v5 delta (the
    # same change back and forth: three deltas, for a median on this shared machine)
    plan = [("full", old), ("delta", new), ("full", old), ("auto", new), ("delta", old),
            ("delta", new)]
    cmd = [sys.executable, __file__, "--receive", f"{connect_to}:{port}:{len(plan)}:{threads}"]
    if netns:
        cmd = ["ip", "netns", "exec", NS, *cmd]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src")}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=env)
    while sender.n_receivers < 1:
        time.sleep(0.05)
    results = {}
    pos, a, b = reported_changes(old, new) if changed else (None, None, None)  # old <-> new
    pub = Publisher(sender, PublisherConfig(codec="delta", anchor_budget=10.0, threads=threads))
    for v, (codec, state) in enumerate(plan):
        pub.cfg = PublisherConfig(codec=codec, anchor_budget=10.0, threads=threads)
        t0 = time.time()
        hint = None
        if changed and v:  # v4 goes back from new to old
            hint = Changed(v - 1, pos, *((b, a) if state is old else (a, b)))
        stats = pub.publish(state, v, changed=hint)
        line = json.loads(proc.stdout.readline())
        assert line["version"] == v and line["hash"] == pub.hash, line
        results[f"v{v}_{codec}"] = {"seconds": line["t"] - t0, "codec_sent": stats.codec,
                                    "bytes": stats.payload_bytes, "reason": stats.reason,
                                    "encode_s": stats.encode_s, "send_s": stats.send_s}
        print(f"  v{v} asked {codec}: sent {stats.codec} {stats.payload_bytes / 1e6:.1f} MB "
              f"in {line['t'] - t0:.3f}s end to end (encode {stats.encode_s:.3f}s, "
              f"send {stats.send_s:.3f}s), hash verified", flush=True)
    proc.wait(60)
    sender.close()
    if relay:
        relay.close()
    full_s = (results["v0_full"]["seconds"] + results["v2_full"]["seconds"]) / 2
    results["full_over_delta"] = full_s / results["v1_delta"]["seconds"]
    delta_s = sorted(results[f"v{v}_delta"]["seconds"] for v in (1, 4, 5))[1]
    results["median_delta_s"] = delta_s
    results["full_v2_over_median_delta"] = results["v2_full"]["seconds"] / delta_s
    return results


def section_tcp(old, new, copies: int, link: str, threads: int = 1,
                changed: bool = False) -> dict:
    big_old, big_new = tiled(old, copies), tiled(new, copies)
    gb = sum(t.numel() * 2 for t in big_old.values()) / 1e9
    print(f"  state {gb:.2f} GB", flush=True)
    out = {"state_GB": gb, "threads": threads, "changed_reported": changed}
    if link == "auto":
        link = "netns" if netns_available() else "relay"
    out["link"] = link
    if link == "netns":
        netns_down()
        try:
            netns_up("1gbit")
            print("  1 Gbit/s veth + tbf:", flush=True)
            out["limited_1gbit"] = run_link(big_old, big_new, HOST_IP, HOST_IP, netns=True,
                                            threads=threads, changed=changed)
        finally:
            netns_down()
    else:
        print("  1 Gbit/s rate-limited loopback relay (no network namespaces):", flush=True)
        out["limited_1gbit"] = run_link(big_old, big_new, "127.0.0.1", "127.0.0.1",
                                        netns=False, relay_rate=1e9 / 8, threads=threads,
                                        changed=changed)
    print("  unlimited loopback:", flush=True)
    out["loopback"] = run_link(big_old, big_new, "127.0.0.1", "127.0.0.1", netns=False,
                               threads=threads, changed=changed)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sections", default=SECTIONS)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--lr", type=float, default=1e-6)
    ap.add_argument("--copies", type=int, default=4)
    ap.add_argument("--link", choices=("auto", "netns", "relay"), default="auto",
                    help="1 Gbit/s link: veth + tc in a network namespace (needs root), a "
                         "rate-limited loopback relay, or netns where it works")
    ap.add_argument("--repeat", type=int, default=5, help="timed runs per throughput figure")
    ap.add_argument("--timed-step", type=int, default=0,
                    help="the step the throughput and tcp sections time (default: the one "
                         "closest to 1%% changed)")
    ap.add_argument("--cache", help="folder to save the bf16 states in on the first run and "
                    "load them from on later runs with the same --steps and --lr")
    ap.add_argument("--model", choices=("embedded", "tiny"), default="embedded",
                    help="tiny: a ~5M-parameter Llama instead of SmolLM2-135M (smokes)")
    ap.add_argument("--tilings", default="1,4,16", help="scaling: copies of the state")
    ap.add_argument("--threads", type=int, default=1,
                    help="scaling and tcp: threads (shards) of the codec and the subscriber")
    ap.add_argument("--cast", default="",
                    help="scaling: also time the sender from fp32 masters: 'first' (cast, "
                         "then compare), 'fused' (compare while casting), or 'first,fused'")
    ap.add_argument("--changed", action="store_true",
                    help="tcp: each delta is told the changed positions, as the trainer's "
                         "optimizer step reports them (no comparison pass on the sender)")
    resultfile.add_args(ap)
    ap.add_argument("--receive", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.receive:
        host, port, n, threads = args.receive.split(":")
        return receiver_main(host, int(port), int(n), int(threads))
    sections = args.sections.split(",")
    benchmark = "weight_sync_scaling" if set(sections) <= SCALING_SECTIONS else "weight_sync"
    if args.label is None and benchmark == "weight_sync" and args.sections != SECTIONS:
        args.label = "-".join(sections)
    rec = resultfile.start(benchmark, args)
    if args.model == "tiny":
        print(f"tiny Llama, AdamW lr={args.lr}, {args.steps} steps", flush=True)
        states = tiny_stream(args.steps, args.lr)
    else:
        print(f"SmolLM2-135M, AdamW lr={args.lr}, {args.steps} steps", flush=True)
        states = rl_stream(args.steps, args.lr, args.cache)
    from traingym.weights import native

    res = {"model": args.model, "lr": args.lr, "steps": args.steps,
           "native": native.lib is not None}  # the codec's C kernels (weights/native.py)
    densities = [step_sizes(a, b)["density"] for a, b in zip(states, states[1:])] \
        if "compress" not in sections else None
    if "compress" in sections:
        res["compress"] = section_compress(states)
        densities = [r["density"] for r in res["compress"]["steps"]]
    # the step closest to 1% density stands for "realistic" in the timed sections
    mid = args.timed_step or int(np.argmin([abs(d - 0.01) for d in densities])) + 1
    res["timed_step"], res["timed_density"] = mid, densities[mid - 1]
    old, new = states[mid - 1], states[mid]
    del states
    if "throughput" in sections:
        print(f"throughput on step {mid} (density {densities[mid - 1]:.4f})", flush=True)
        res["throughput"] = section_throughput(old, new, args.repeat)
    if "tcp" in sections:
        print(f"tcp end to end on step {mid}", flush=True)
        res["tcp"] = section_tcp(old, new, args.copies, args.link, args.threads, args.changed)
    if "lthash" in sections:
        from weight_sync_scaling import section_lthash

        print("incremental hash, ns per element", flush=True)
        res["lthash"] = section_lthash(new)
    if "tier" in sections:
        from weight_sync_scaling import section_tier

        print(f"tier against no tier on step {mid}, tiled {args.copies}x, one thread",
              flush=True)
        res["tier"] = section_tier(old, new, args.copies, args.repeat)
    if "scaling" in sections:
        from weight_sync_scaling import section_scaling

        print(f"per-phase times on step {mid} (density {densities[mid - 1]:.4f}), tiled "
              f"{args.tilings}, {args.threads} thread(s)", flush=True)
        tilings = [int(k) for k in args.tilings.split(",")]
        modes = [c for c in args.cast.split(",") if c]
        res["scaling"] = section_scaling(old, new, tilings, args.repeat, args.threads, modes)
    rec.write(res)


if __name__ == "__main__":
    main()
