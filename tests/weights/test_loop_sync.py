"""The loop's weight sync end to end on the tiny model: after every step the engine holds
exactly the trainer's weights (hash-equal, in the engine's dtype) at the published version,
over inproc, tcp (real sockets), filesystem and shm; every sample carries that version; a
corrupted payload makes the engine's side resync (from an anchor when its state was touched)
and the engine never generates with weights other than the ones it claims; bad names fail
before any work; a resumed run's publisher starts with an anchor."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import traingym
from traingym.core.errors import ConfigError
from traingym.loop.sync import train_loop
from traingym.observability.events import read_events
from traingym.loop.build import build_run
from traingym.weights import registry
from traingym.weights.base import Payload
from traingym.weights.colocated import wire_state
from traingym.weights.frame import seal
from traingym.weights.hashing import state_hash

SYNC_KEYS = ("sync_version", "sync_codec", "sync_reason", "sync_bytes", "sync_full_bytes",
             "sync_changed_frac", "sync_encode_s", "sync_send_s", "sync_apply_s",
             "sync_engine_s", "sync_corrupt", "sync_resyncs")


def _cfg(steps=3, engine_dtype="float32", **weights):
    return traingym.build_config("tiny", overrides={
        "steps": steps, "model": {"engine_dtype": engine_dtype},
        "checkpoint": {"every": 2}, "eval": {"before": False, "after": False},
        "weights": {"codec": "delta", "anchor_budget": 100.0, **weights}})


class Watched:
    """A built run whose engine is checked before every generate and after every publish."""

    def __init__(self, cfg, run_dir, resume=False):
        self.run, self.start = build_run(cfg, run_dir, resume, progress=False)
        self.dtype = self.run.weights.dtype
        self.published = {self.start: self.trainer_hash()}  # the anchor build_run sent
        self.after_publish = {self.start: self.engine_hash()}
        self.served: list[tuple[int, str]] = []
        engine = self.run.engine
        generate, publish = engine.generate, self.run.weights.publish

        async def checked_generate(requests):
            self.served.append((engine.version, self.engine_hash()))
            return await generate(requests)

        def recorded_publish(state, version, **kw):
            self.published[version] = state_hash(wire_state(state, self.dtype))
            stats = publish(state, version, **kw)
            self.after_publish[version] = self.engine_hash()
            return stats

        engine.generate = checked_generate
        self.run.weights.publish = recorded_publish

    def trainer_hash(self) -> str:
        return state_hash(wire_state(self.run.trainer.export(), self.dtype))

    def engine_hash(self) -> str:
        return state_hash(wire_state(self.run.engine.model.state_dict(), self.dtype))

    def train(self) -> None:
        train_loop(self.run, self.start)
        self.run.close()

    def check(self) -> None:
        assert self.after_publish == self.published  # the engine matched after every step
        assert [v for v, _ in self.served] == list(range(self.start, self.run.cfg.steps))
        for version, h in self.served:
            assert h == self.published[version], f"engine served wrong weights as v{version}"


def _check_events(run_dir, start, steps):
    events = read_events(run_dir)
    assert [e["step"] for e in events] == list(range(1, steps + 1))
    for e in events[start:]:
        assert all(k in e for k in SYNC_KEYS), sorted(set(SYNC_KEYS) - set(e))
        assert e["sync_version"] == e["step"]  # published after the step's optimizer update
        assert e["policy_version"] == e["step"] - 1  # what the trainer learned from
        assert e["sync_bytes"] > 0 and e["sync_full_bytes"] > 0
        assert e["sync_encode_s"] >= 0 and e["sync_apply_s"] >= 0
    return events


@pytest.mark.parametrize("transport", ["inproc", "tcp", "filesystem", "shm"])
def test_engine_serves_the_trainers_weights_every_step(tmp_path, transport):
    w = Watched(_cfg(transport=transport), tmp_path / "run")
    assert w.run.weights.last["sync_codec"] == "full"  # the first update is an anchor
    w.train()
    w.check()
    events = _check_events(tmp_path / "run", 0, 3)
    for e in events:
        assert e["sync_codec"] == "delta" and e["sync_reason"] == "delta"
        assert 0 < e["sync_changed_frac"] <= 1
        assert e["sync_corrupt"] == 0
    assert w.run.weights.subscriber.stats.anchors == 1
    assert not (tmp_path / "run" / "weights").exists()  # filesystem scratch removed on close


@pytest.mark.parametrize("transport", ["inproc", "tcp"])
def test_weights_threads_code_and_apply_in_shards(tmp_path, transport):
    """weights.threads reaches the trainer's codec and the engine's subscriber; the shards'
    deltas keep the engine exact."""
    w = Watched(_cfg(transport=transport, threads=3), tmp_path / "run")
    assert w.run.weights.publisher.delta.threads == 3
    assert w.run.weights.subscriber.cfg.threads == 3
    w.train()
    w.check()
    assert all(e["sync_codec"] == "delta" for e in _check_events(tmp_path / "run", 0, 3))


def test_bf16_engine_gets_the_cast_of_the_fp32_masters(tmp_path):
    w = Watched(_cfg(engine_dtype="bfloat16"), tmp_path / "run")
    assert w.dtype == torch.bfloat16
    assert next(iter(w.run.trainer.export().values())).dtype == torch.float32
    w.train()
    w.check()
    e = _check_events(tmp_path / "run", 0, 3)[-1]
    assert e["sync_full_bytes"] == 2 * sum(
        t.numel() for t in wire_state(w.run.trainer.export(), torch.float32).values())


def _corrupt(payload: Payload, reseal: bool) -> Payload:
    """A copy with one byte flipped in its largest buffer (the sender's copy is untouched)."""
    bufs = [memoryview(bytearray(b)) for b in payload.buffers]
    big = max(bufs, key=lambda b: b.nbytes)
    big[big.nbytes // 2] ^= 0x5A
    out = Payload(payload.header, bufs)
    return seal(out) if reseal else out


def _flaky(base: type, version: int, reseal: bool) -> type:
    class Flaky(base):
        hits = 0

        def receive(self, timeout):
            p = super().receive(timeout)
            if p.header.target_version == version and not Flaky.hits:
                Flaky.hits += 1
                return _corrupt(p, reseal)
            return p

    return Flaky


@pytest.mark.parametrize("reseal", [False, True], ids=["flipped-in-flight", "wrong-but-sealed"])
@pytest.mark.parametrize("transport", ["inproc", "tcp"])
def test_corrupt_payload_resyncs_and_never_serves_wrong_weights(tmp_path, monkeypatch,
                                                                transport, reseal):
    real = registry.get(transport)
    flaky = _flaky(real.receiver, version=2, reseal=reseal)
    monkeypatch.setitem(registry.TRANSPORTS.entries, transport,
                        dataclasses.replace(real, receiver=flaky))
    w = Watched(_cfg(transport=transport), tmp_path / "run")
    w.train()
    assert flaky.hits == 1
    w.check()
    events = _check_events(tmp_path / "run", 0, 3)
    assert [e["sync_corrupt"] for e in events] == [0, 1, 0]
    assert events[1]["sync_resyncs"] >= 1
    stats = w.run.weights.subscriber.stats
    # A bad body hash is caught before any weight is touched: resync from the held version.
    # A sealed but wrong delta is caught after applying: the state is suspect, so the
    # subscriber asks for the anchor and replays the chain.
    assert stats.anchors == (2 if reseal else 1)


def test_bad_names_fail_before_work(tmp_path):
    with pytest.raises(ConfigError, match=r"unknown codec 'zip'.*'auto', 'delta', 'full'"):
        traingym.build_config("tiny", overrides={"weights": {"codec": "zip"}})
    with pytest.raises(ConfigError, match=r"'dist' cannot be selected in the training loop: "
                       r"the loop sets up no process group.*'filesystem', 'inproc', 'shm', 'tcp'"):
        traingym.build_config("tiny", overrides={"weights": {"transport": "dist"}})
    with pytest.raises(ConfigError, match="unknown key 'weights.port'"):
        traingym.build_config("tiny", overrides={"weights": {"port": 1}})
    cfg = _cfg().model_dump()
    cfg["weights"]["transport"] = "carrier-pigeon"
    with pytest.raises(ConfigError, match="carrier-pigeon"):
        traingym.train(cfg, run_dir=tmp_path / "run", progress=False)
    assert not (tmp_path / "run").exists()


def test_resumed_run_starts_with_an_anchor(tmp_path):
    traingym.train(_cfg(steps=2), run_dir=tmp_path / "run", progress=False)
    w = Watched(_cfg(steps=4), tmp_path / "run", resume=True)
    assert w.start == 2
    first = w.run.weights.last
    assert (first["sync_version"], first["sync_codec"], first["sync_reason"]) == \
        (2, "full", "first")
    w.train()
    w.check()
    events = _check_events(tmp_path / "run", 2, 4)
    assert [e["sync_codec"] for e in events[2:]] == ["delta", "delta"]


@pytest.mark.parametrize("engine_dtype", ["float32", "bfloat16"])
def test_trainer_and_engine_do_not_share_weights(tmp_path, engine_dtype):
    """The engine never serves the trainer's tensors (an optimizer step must not change
    what it generates with); the subscriber applies into the engine's own tensors (no
    verified copy beside them), the publisher's shadow is those same tensors
    (Publisher.share_shadow), and the inproc chain keeps no frames once it holds the
    version: the sync keeps no copy of the model."""
    w = Watched(_cfg(engine_dtype=engine_dtype), tmp_path / "run")
    trainer = {t.untyped_storage().data_ptr() for t in w.run.trainer.export().values()}
    engine = {t.untyped_storage().data_ptr() for t in w.run.engine.model.state_dict().values()}
    sub = {t.untyped_storage().data_ptr() for t in w.run.weights.subscriber.state.values()}
    shadow = {t.untyped_storage().data_ptr() for t in w.run.weights.publisher._shadow.values()}
    assert w.run.weights.in_place and sub <= engine
    assert not trainer & engine and not trainer & sub and shadow <= engine
    assert w.run.weights.sender.hub.chain._frames == []
    before = w.engine_hash()
    with torch.no_grad():  # the trainer's masters move; the engine's weights do not
        for t in w.run.trainer.export().values():
            t.add_(1.0)
    assert w.engine_hash() == before
    w.run.close()


@pytest.mark.parametrize("engine_dtype", ["float32", "bfloat16"])
def test_shared_shadow_full_hashes_equal_the_engines(tmp_path, monkeypatch, engine_dtype):
    """With the shadow shared with the engine (in place), every delta's full hash is the
    trainer's state cast, one tensor at a time; the subscriber checks each against its own
    whole state, so a wrong one would count as corrupt and resync."""
    import traingym.weights.colocated as colocated

    real = colocated.PublisherConfig
    monkeypatch.setattr(colocated, "PublisherConfig", lambda *a, **k: dataclasses.replace(
        real(*a, **k), full_hash_every=1))
    w = Watched(_cfg(engine_dtype=engine_dtype), tmp_path / "run")
    assert w.run.weights.publisher.cfg.full_hash_every == 1
    w.train()
    w.check()
    assert w.run.weights.publisher._shared
    events = _check_events(tmp_path / "run", 0, 3)
    assert [e["sync_corrupt"] for e in events] == [0, 0, 0]
    assert [e["sync_codec"] for e in events] == ["delta"] * 3
    assert [e["sync_resyncs"] for e in events] == [0, 0, 0]


def test_a_failed_anchor_send_leaves_the_shared_engine_tensors_untouched(tmp_path, monkeypatch):
    """With the shadow shared (in place, bf16), an anchor is encoded from the trainer's state,
    never written into the engine's tensors first: a send that fails leaves the engine serving
    its verified version; the next publish recovers."""
    w = Watched(_cfg(engine_dtype="bfloat16", codec="full"), tmp_path / "run")
    run = w.run
    assert run.weights.publisher.shared
    before = w.engine_hash()
    with torch.no_grad():
        for p in run.trainer.model.parameters():
            p.add_(0.01)
    real = run.weights.sender.send

    def broken(payload):
        raise ConnectionError("link down")

    monkeypatch.setattr(run.weights.sender, "send", broken)
    with pytest.raises(ConnectionError):
        run.weights.publish(run.trainer.export(), version=1)
    assert w.engine_hash() == before and run.weights.subscriber.valid
    monkeypatch.setattr(run.weights.sender, "send", real)
    run.weights.publish(run.trainer.export(), version=1)
    assert w.engine_hash() == w.trainer_hash() != before
    run.close()


def test_an_engine_holding_the_trainers_tensors_gets_its_own_copy(tmp_path):
    """An engine whose writable tensors are the trainer's own (same dtype, shared memory) is
    not written in place: each delta would land in the masters and read the optimizer's
    values as the old ones. The subscriber keeps a verified copy instead, and the trainer's
    tensors change only by the trainer's hand."""
    from traingym.weights.config import WeightsConfig
    from traingym.weights.colocated import ColocatedSync

    torch.manual_seed(0)
    trainer = {"a": torch.randn(64, 32), "b": torch.randn(1000)}

    class SharingEngine:
        served: list = []

        def writable_state(self):
            return dict(trainer)

        def update_weights(self, state, version):
            self.served.append((version, state_hash(state)))

    engine = SharingEngine()
    sync = ColocatedSync(engine, WeightsConfig(codec="delta"), torch.float32, tmp_path / "w")
    try:
        sync.publish(trainer, 0)
        assert not sync.in_place
        shared = {t.untyped_storage().data_ptr() for t in trainer.values()}
        assert not shared & {t.untyped_storage().data_ptr()
                             for t in sync.subscriber.state.values()}
        for v in (1, 2):
            with torch.no_grad():
                trainer["a"][v, :5] += 0.5  # the optimizer's step
            want = state_hash(trainer)
            stats = sync.publish(trainer, v)
            assert stats.codec == "delta" and engine.served[-1] == (v, want)
            assert state_hash(trainer) == want  # the sync wrote nothing into the masters
    finally:
        sync.close()
