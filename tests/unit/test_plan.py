"""`traingym plan`: its rows are the simulator's results on configs built here by hand from
the traingym config and the cluster flags (not with plan/planner.py's builders); 'dist' rows are
marked not runnable and never chosen; bad input is one `traingym: ...` line and exit 2;
`traingym --help` stays light."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from traingym import cli
from traingym.plan.simulate import SimConfig, simulate, size_cluster

# the delta codec's figures traingym ships (package data, benchmarks/plan_figures.py)
FIGURES = Path(__file__).resolve().parents[2] / "src/traingym/plan/figures/codec.json"


def _codec() -> dict:
    """The shipped figures, rebuilt from what the file says was measured (not its `figures`)."""
    m = json.loads(FIGURES.read_text())["measured"]
    wall = m["wall_GBps"]
    return {"density": m["changed_at_timed_step"] / m["state_elements"],
            "frame": m["frame_bytes_at_timed_step"] / m["changed_at_timed_step"],
            "encode": wall["encode_with_hash_GBps"] * 1e9,
            "decode": wall["decode_with_2_hashes_GBps"] * 1e9, "hash": wall["hash_GBps"] * 1e9}


def _expected(params, prompts, group, completion, wire_bytes, gpus, mode, k, codec):
    """The simulator's config, built from the stated rules: the h100 preset scaled by
    8.03e9 / params, 256 prompt tokens, fp32 gradients, no env, tcp fan-out at 100 Gbit/s."""
    scale = 8.03e9 / params
    c = _codec()
    state = wire_bytes * params
    cfg = SimConfig(
        steps=8, warmup=4, prompts_per_step=prompts, group_size=group, mode=mode,
        max_staleness=k, gen_fixed_s=0.0, gen_row_s=0.0, completion_tokens=completion,
        engine_tokens_per_s=8000 * scale, seq_tokens_per_s=150 * scale, env_median_s=0.0,
        env_sigma=0.0, env_timeout_s=0.0, env_workers=0, train_s=0.0,
        train_tokens_per_sample=256 + completion, train_tokens_per_s_per_gpu=5000 * scale,
        grad_bytes=4 * params, node_gpus=8, allreduce_bytes_per_s=450e9,
        internode_bytes_per_s=40e9, seed=0)
    if codec == "full":
        cfg = SimConfig(**{**cfg.__dict__, "publish_s": state / c["hash"],
                           "apply_s": state / c["hash"]})
    else:
        cfg = SimConfig(**{**cfg.__dict__, "publish_s": state / c["encode"],
                           "apply_s": state / c["decode"],
                           "weight_bytes": params * c["density"] * c["frame"]})
    if mode == "sync":
        return size_cluster(cfg, gpus, pool_tolerance=None)
    wire = state if codec == "full" else cfg.weight_bytes  # full: every byte over the link
    cfg = SimConfig(**{**cfg.__dict__, "weight_bytes": wire, "link_bytes_per_s": 12.5e9,
                       "link_latency_s": 50e-6,
                       "fanout": "sender", "publish_waits_for_link": True})
    return size_cluster(cfg, gpus, pool_tolerance=None)


def _plan(capsys, *argv) -> tuple[str, dict[str, str]]:
    assert cli.main(["plan", *argv, "--sim-steps", "8"]) == 0
    out = capsys.readouterr().out
    rows = {line[:26].strip(): line for line in out.splitlines()
            if line.startswith(("sync, ", "async k="))}
    return out, rows


def _check(rows, name, expected, split):
    line = rows[name].split()
    r = expected.result
    assert split in line, (name, line)
    assert f"{r.seconds_per_step:.3g}" in line and f"{r.samples_per_s:.4g}" in line, (name, line)


def test_tiny_config_rows_are_the_simulators(capsys):
    from traingym.models.loader import tiny_model, tiny_tokenizer

    params = sum(p.numel() for p in tiny_model(tiny_tokenizer()).parameters())
    out, rows = _plan(capsys, "--preset", "tiny", "--gpus", "4")
    assert f"{params / 1e6:.2f}M params" in out and "weights 0.4 MB fp32" in out
    assert "far too high" in out  # rates scaled to a 0.1M model are flagged
    sync = _expected(params, 4, 4, 4, 4, 4, "sync", 0, "full")
    _check(rows, "sync, colocated", sync, "colocated")
    for k in (1, 2):
        for codec in ("full", "delta"):
            p = _expected(params, 4, 4, 4, 4, 4, "async", k, codec)
            _check(rows, f"async k={k}, {codec}, tcp", p, f"{p.trainer_gpus}+{p.engines}")
            assert rows[f"async k={k}, {codec}, tcp"].endswith("yes")
    assert "no [1]" in rows["async k=2, full, dist"]
    reason = out.split("\n[1] ")[1].split("\n")[0]  # the config's own reason
    assert "'dist'" in reason
    best = out.split("best runnable: ")[1].split(":")[0]
    assert best in rows and "dist" not in best and rows[best].endswith("yes")


def test_default_config_with_a_given_rate_and_an_env(capsys, tmp_path):
    cluster = tmp_path / "cluster.toml"
    cluster.write_text('gpus = 16\ngpu = "h100"\n')
    out, rows = _plan(capsys, "--cluster", str(cluster), "--train-tokens-per-s", "2e6",
                      "--sandboxes", "32", "--set", "steps=3")
    assert "134.52M params" in out and "weights 269.0 MB bf16" in out
    assert "train_tokens_per_s 2e+06 (given)" in out
    params = 134515008
    sync = _expected(params, 16, 4, 8, 2, 16, "sync", 0, "full").result
    # the given training rate replaces the scaled preset's; the pool is given
    cfg = SimConfig(steps=8, warmup=4, prompts_per_step=16, group_size=4, mode="sync",
                    gen_fixed_s=0.0, gen_row_s=0.0, completion_tokens=8,
                    engine_tokens_per_s=8000 * 8.03e9 / params,
                    seq_tokens_per_s=150 * 8.03e9 / params, env_median_s=0.0, env_sigma=0.0,
                    env_workers=32, train_s=0.0, train_tokens_per_sample=264,
                    train_tokens_per_s_per_gpu=2e6, grad_bytes=4 * params, node_gpus=8,
                    allreduce_bytes_per_s=450e9, internode_bytes_per_s=40e9,
                    publish_s=2 * params / _codec()["hash"],
                    apply_s=2 * params / _codec()["hash"], trainer_gpus=16, engines=16)
    r = simulate(cfg)
    assert r.seconds_per_step != sync.seconds_per_step  # the given rate changed the step
    line = rows["sync, colocated"].split()
    assert f"{r.seconds_per_step:.3g}" in line and f"{r.samples_per_s:.4g}" in line
    assert "best runnable: " in out


BAD = [
    (["--preset", "tiny"], "--gpus N"),
    (["--preset", "tiny", "--gpus", "0"], "--gpus N"),
    (["--preset", "tiny", "--gpus", "x"], "invalid int value"),
    (["--preset", "tiny", "--gpus", "8", "--gpu", "tpu9"], "no preset"),
    (["--preset", "tiny", "--gpus", "8", "--node-gpus", "0"], "--node-gpus 0"),
    (["--preset", "tiny", "--gpus", "2", "--gpus-per-engine", "4"], "fewer than"),
    (["--preset", "tiny", "--gpus", "8", "--cluster", "missing.toml"], "no such file"),
    (["--preset", "tiny", "--gpus", "8", "--codec-figures", "missing.json"], "does not exist"),
    (["--preset", "tiny", "--gpus", "8", "--env-median-s", "1", "--env-p99-s", "0.5"],
     "median <= p99"),
    (["--preset", "tiny", "--gpus", "8", "--sim-steps", "3"], "at least 8"),
    (["--preset", "tiny", "--gpus", "8", "--prompt-tokens", "0"], "--prompt-tokens"),
    (["--preset", "tiny", "--gpus", "8", "--set", "nope=1"], "nope"),
    (["--preset", "tiny", "--gpus", "8", "--set", "task.env=examples.multi_turn:RetryArithmetic"],
     "--env-median-s"),
    (["--preset", "tiny", "--gpus", "8", "--set", "model.path=/no/such/model"], "/no/such/model"),
]


@pytest.mark.parametrize("argv,says", BAD, ids=[" ".join(a[2:]) or "no gpus" for a, _ in BAD])
def test_bad_input_is_one_line_and_exit_2(capsys, tmp_path, argv, says):
    assert cli.main(["plan", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("traingym: ") and err.count("\n") == 1 and says in err, err


@pytest.mark.parametrize("data,says", [({"figures": {"changed_fraction": 0.01}}, "lacks"),
                                       ({"timed_step": 1, "compress": {"steps": []}}, "lacks"),
                                       ([1, 2], "lacks")])
def test_bad_codec_figures_file(capsys, tmp_path, data, says):
    path = tmp_path / "figures.json"
    path.write_text(json.dumps(data))
    assert cli.main(["plan", "--preset", "tiny", "--gpus", "8", "--codec-figures",
                     str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("traingym: ") and err.count("\n") == 1 and says in err, err


def test_the_shipped_codec_figures_and_their_provenance():
    """The package's figures file says what was measured, where, when and at which commit, and
    its figures are the ones its measurements give."""
    from traingym.plan.planner import codec_figures

    data = json.loads(FIGURES.read_text())
    prov = data["provenance"]
    assert len(prov["commit"]) == 40 and prov["started"] and prov["machine"]["cores"]
    assert "weight_sync.py" in prov["measured_by"] and "plan_figures.py" in prov["command"]
    f, c = codec_figures(), _codec()
    assert f.source.startswith("traingym/plan/figures/codec.json")
    for got, want in ((f.changed_fraction, c["density"]), (f.bytes_per_changed, c["frame"]),
                      (f.encode_bytes_per_s, c["encode"]), (f.decode_bytes_per_s, c["decode"]),
                      (f.hash_bytes_per_s, c["hash"])):
        assert got == pytest.approx(want, rel=1e-12)


def test_codec_figures_from_a_weight_sync_result_or_a_figures_file(tmp_path):
    """--codec-figures reads a weight_sync.py result (compress + throughput) or a file like the
    shipped one."""
    from traingym.plan.planner import codec_figures

    ws = {"timed_step": 2, "compress": {"steps": [
              {"density": 0.5, "traingym_frame": 0, "changed": 1},
              {"density": 0.02, "traingym_frame": 300, "changed": 200}]},
          "throughput": {"density": 0.02, "wall": {"encode_with_hash_GBps": 1.5,
                                                   "decode_with_2_hashes_GBps": 2.5,
                                                   "hash_GBps": 20.0}}}
    (tmp_path / "ws.json").write_text(json.dumps(ws))
    f = codec_figures(tmp_path / "ws.json")
    assert (f.changed_fraction, f.bytes_per_changed, f.encode_bytes_per_s,
            f.decode_bytes_per_s, f.hash_bytes_per_s) == (0.02, 1.5, 1.5e9, 2.5e9, 20e9)
    assert f.source == "ws.json, step 2"
    shipped = json.loads(FIGURES.read_text())
    shipped["figures"]["encode_bytes_per_s"] = 7e9
    (tmp_path / "mine.json").write_text(json.dumps(shipped))
    mine = codec_figures(tmp_path / "mine.json")
    assert mine.encode_bytes_per_s == 7e9 and str(tmp_path / "mine.json") in mine.source


def test_plan_needs_no_source_checkout(tmp_path):
    """An installed traingym plans with its own figures: run from another folder, nothing
    under the checkout's benchmarks/ (nor any file named like a result) is opened."""
    code = """
import sys
opened = []
sys.addaudithook(lambda e, a: opened.append(str(a[0])) if e == "open" and a and
                 isinstance(a[0], (str, bytes)) else None)
from traingym import cli
assert cli.main(["plan", "--preset", "tiny", "--gpus", "4", "--sim-steps", "8"]) == 0
bad = [p for p in opened if "benchmarks" in p or "weight_sync" in p]
assert not bad, bad
assert any(p.endswith("plan/figures/codec.json") for p in opened), opened
"""
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                         text=True, timeout=300, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "delta codec (traingym/plan/figures/codec.json, " in out.stdout


@pytest.mark.parametrize("text,says", [("node_gpu = 8\n", "did you mean 'node_gpus'?"),
                                       ('gpus = "eight"\n', "expected int"),
                                       ("gpus = [\n", "not TOML")])
def test_bad_cluster_file(capsys, tmp_path, text, says):
    path = tmp_path / "c.toml"
    path.write_text(text)
    assert cli.main(["plan", "--preset", "tiny", "--cluster", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("traingym: ") and err.count("\n") == 1 and says in err, err


def test_help_imports_stay_light():
    code = ("import sys, traingym.cli; bad = {'torch', 'pydantic', 'transformers'} & "
            "set(sys.modules); assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("name", ["qwen3-30b-a3b", "mixtral-8x7b"])
def test_a_moe_preset_plans_compute_from_active_and_memory_from_all_parameters(capsys, name):
    from traingym.models.presets import PRESETS

    p = PRESETS[name]
    out, rows = _plan(capsys, "--set", f"model.preset={name}", "--set",
                      "model.path=/nonexistent/moe", "--gpus", "16")
    assert (f"{p.params / 1e6:.2f}M params ({p.active_params / 1e6:.2f}M active a token"
            in out)
    assert f"weights {p.params * 2 / 1e6:.1f} MB bf16" in out  # every expert on the wire
    assert f"decode_tokens_per_s {8000 * 8.03e9 / p.active_params:.4g}" in out
    assert f"total {p.memory()['total'] / 1e9:.1f} GB" in out and rows


def test_model_params_of_a_moe_folder_counts_active_experts(tmp_path):
    from moe_tiny import save_tiny_moe  # tests/ is on sys.path

    from traingym.plan.cli import model_params

    # shared: embeddings 2 x 434 x 64 + the final norm 64 + 2 layers x (attention 12288,
    # norms 128, router 64 x 8, Qwen3's q/k norms 2 x 16)
    for family, shared in (("qwen3_moe", 81536), ("mixtral", 81472)):
        total, active = model_params(save_tiny_moe(tmp_path / family, family))
        experts = 2 * 8 * 3 * 64 * 32  # 2 layers x 8 experts x (gate, up, down) 64 x 32
        assert (total, active) == (shared + experts, shared + experts * 2 // 8), family
