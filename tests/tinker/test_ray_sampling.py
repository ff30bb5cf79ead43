"""`traingym tinker` with `cluster.type = "ray"`: the sampling engine runs as a Ray actor on a
one-node Ray cluster started here (one CPU, tests/raynodes.py), the trainer in the server's
process. Through the SDK: a trained LoRA client's save_weights_and_get_sampling_client +
sample give log-probs at T=1 equal to the training client's forward log-probs of the same
tokens and compute_logprobs equal to them too (as the local-mode test checks), the engine's
weights hash equals the publisher's, and the engine is an actor in another process; switching
to another session on the same base and back republishes (a version each) and the trained
session samples as before.
The config file's `[cluster]` and `[weights]` tables reach the server's config.
Without ray installed this skips (and fails under CI, tests/prereq.py)."""

import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from conftest import Live, datum, free_port, serve
from prereq import require
from raynodes import _free_ports, _node_cmd, _stop, _wait_for


@pytest.fixture(scope="module")
def ray_head():
    require("ray", "Ray mode needs the `ray` extra (pip install 'traingym[ray]')")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "RAY_AUTH_MODE": "disabled",
           "RAY_USAGE_STATS_ENABLED": "0"}
    port, temp = _free_ports(1)[0], Path(f"/tmp/tgray-t-{os.getpid()}")
    cmd = _node_cmd(temp, _free_ports(7))
    cmd[2:2] = ["--head", f"--port={port}", "--include-dashboard=false",
                f"--ray-client-server-port={_free_ports(1)[0]}"]
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RAY_AUTH_MODE", "disabled")
        mp.setenv("RAY_USAGE_STATS_ENABLED", "0")
        proc = subprocess.Popen(cmd, env=env, start_new_session=True)
        try:
            _wait_for(f"127.0.0.1:{port}", 1, [(proc, temp)])
            yield f"127.0.0.1:{port}"
        finally:
            _stop(proc, temp)
            shutil.rmtree(temp, ignore_errors=True)


def test_config_file_sections_reach_the_server(tmp_path):
    from traingym.core.errors import ConfigError
    from traingym.tinker.server import load_config

    f = tmp_path / "t.toml"
    f.write_text('[tinker]\nport = 9001\n[cluster]\ntype = "ray"\naddress = "h:1"\n'
                 '[weights]\ntransport = "tcp"\ncodec = "full"\n')
    cfg = load_config(str(f))
    assert (cfg.port, cfg.cluster.type, cfg.cluster.address) == (9001, "ray", "h:1")
    assert (cfg.weights.transport, cfg.weights.codec) == ("tcp", "full")
    f.write_text('[tinker]\n[cluster]\ntype = "ray"\naddress = "h:1"\n')
    with pytest.raises(ConfigError, match="does not reach other nodes"):
        load_config(str(f))


@pytest.mark.slow  # 60-65 s here: the cluster's start (21 s) and stop (11 s) included
def test_ray_sampler_serves_the_trained_weights(ray_head, tmp_path, tokenizer):
    from tinker import types

    from traingym.tinker.config import TinkerConfig
    from traingym.tinker.service import Service

    port = free_port()
    cfg = TinkerConfig(port=port, runs_dir=tmp_path, models=["tiny"], poll_s=2.0,
                       cluster={"type": "ray", "address": ray_head},
                       weights={"transport": "tcp", "codec": "delta"})
    service = Service(cfg)
    server, thread = serve(service, port)
    try:
        sc = Live(service, f"http://127.0.0.1:{port}", "").client()
        tc = sc.create_lora_training_client(base_model="tiny", rank=4, seed=3).result()
        data = [datum(tokenizer.encode("What is 2 + 3? The answer is 5."))]
        for _ in range(3):
            tc.forward_backward(data, "cross_entropy")
            tc.optim_step(types.AdamParams(learning_rate=5e-2)).result()
        sampler = tc.save_weights_and_get_sampling_client().result()
        prompt = tokenizer.encode("What is 2 +")
        res = sampler.sample(types.ModelInput.from_ints(prompt), num_samples=2,
                             sampling_params=types.SamplingParams(max_tokens=5, temperature=1.0,
                                                                  seed=5, stop=[])).result()
        for seq in res.sequences:
            tokens = prompt + list(seq.tokens)
            out = tc.forward([datum(tokens)], "cross_entropy").result()
            want = out.loss_fn_outputs[0]["logprobs"].to_numpy()
            np.testing.assert_allclose(seq.logprobs, want[len(prompt) - 1:], rtol=1e-4,
                                       atol=1e-4)
        scored = sampler.compute_logprobs(types.ModelInput.from_ints(tokens)).result()
        np.testing.assert_allclose(scored[1:], want, rtol=1e-4, atol=1e-4)

        (remote,) = service.engines.engines.values()  # one base: one actor
        assert remote.where["pid"] != os.getpid()  # sampled in the actor, not here
        report = remote.report()
        assert report["hash"] == report["published"] and report["version"] == 1

        # another session on the same base (the base itself), then back: each switch is
        # published as the next version (a delta), and the trained session samples as before
        base = sc.create_sampling_client(base_model="tiny").result()
        greedy = types.SamplingParams(max_tokens=3, temperature=0.0, stop=[])
        other = base.sample(types.ModelInput.from_ints(prompt), 1, greedy).result()
        again = sampler.sample(types.ModelInput.from_ints(prompt), num_samples=2,
                               sampling_params=types.SamplingParams(
                                   max_tokens=5, temperature=1.0, seed=5, stop=[])).result()
        assert [s.tokens for s in again.sequences] == [s.tokens for s in res.sequences]
        np.testing.assert_allclose(again.sequences[0].logprobs, res.sequences[0].logprobs,
                                   rtol=1e-5, atol=1e-5)
        assert other.sequences[0].tokens  # served from the base's weights in between
        report = remote.report()
        assert report["hash"] == report["published"] and report["version"] == 3
    finally:
        server.should_exit = True
        thread.join(30)
    assert not service.engines.engines  # closed with the server
