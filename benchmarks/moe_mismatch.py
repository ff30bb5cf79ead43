"""Train/inference mismatch of a mixture-of-experts policy, with and without routing replay.

Runs the sync loop (`traingym.train`, the tiny preset's arithmetic task, --steps steps of
--prompts prompts x 4 samples, 8 new tokens, T = 1) with a bf16 engine (model.engine_dtype
bfloat16, the built-in engine's fused MoE decode) and an fp32 trainer (trainer.bf16_autocast
false), twice, same seed: algorithm.routing_replay false, then true. From each run's
events.jsonl it writes every step's figures and their means over the steps that trained to a
new result file (benchmarks/resultfile.py, with its provenance), side by side:
mismatch_abs_logp (mean |log p_trainer - log p_engine| over policy tokens), mismatch_kl_k3,
moe_route_mismatch (fraction of (token, MoE layer) pairs whose experts in the trainer's forward
differ from the engine's: 0 under replay) and moe_router_mismatch (the same for what the
trainer's router would choose).

The model: --model, a Hugging Face folder of a Qwen3-MoE or Mixtral checkpoint; by default a
random-init Qwen3-MoE built here (--hidden, --layers, --experts, --top-k; HF's init, router
std 0.02: near-uniform routing, so more route flips than a trained model shows) with the tiny
tokenizer (models/loader.py).

    PYTHONPATH=src .venv/bin/python benchmarks/moe_mismatch.py            # ~minutes
        # -> benchmarks/results/moe_mismatch/<date>-<commit>.json
    PYTHONPATH=src .venv/bin/python benchmarks/moe_mismatch.py --hidden 64 --layers 2 \\
        --experts 8 --steps 2 --prompts 2 --out /tmp/moe_mismatch_smoke.json   # smoke, seconds

Not covered: trained MoE checkpoints (none is stored here), more than one seed, async mode,
rewards (runs this short teach nothing), a bf16 trainer (this CPU has no bf16 kernels).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import resultfile

STEP_KEYS = ("step", "trained_tokens", "mismatch_abs_logp", "mismatch_kl_k3",
             "moe_route_mismatch", "moe_router_mismatch", "loss", "seconds_step")
MEANS = ("mismatch_abs_logp", "mismatch_kl_k3", "moe_route_mismatch", "moe_router_mismatch")


def build_model(folder: Path, args) -> str:
    """A random-init Qwen3-MoE with the tiny tokenizer, saved to `folder`."""
    import torch
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    from traingym.models.loader import tiny_tokenizer

    tok = tiny_tokenizer()
    cfg = Qwen3MoeConfig(
        vocab_size=len(tok), hidden_size=args.hidden, intermediate_size=2 * args.hidden,
        moe_intermediate_size=args.hidden // 2, num_hidden_layers=args.layers,
        num_attention_heads=4, num_key_value_heads=2, head_dim=args.hidden // 4,
        num_experts=args.experts, num_experts_per_tok=args.top_k, norm_topk_prob=True,
        max_position_embeddings=512, tie_word_embeddings=False,
        pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id,
        bos_token_id=tok.bos_token_id)
    torch.manual_seed(args.seed)
    Qwen3MoeForCausalLM(cfg).save_pretrained(folder)
    tok.save_pretrained(folder)
    return str(folder)


def _mean(events: list[dict], key: str) -> float | None:
    vals = [e[key] for e in events if e.get(key) is not None and e["trained_tokens"]]
    return statistics.fmean(vals) if vals else None


def run_one(model: str, replay: bool, args) -> dict:
    import traingym
    from traingym.observability.events import read_events

    cfg = traingym.build_config("tiny", overrides={
        "seed": args.seed, "steps": args.steps, "threads": args.threads,
        "model": {"path": model, "engine_dtype": "bfloat16"},
        "rollout": {"prompts_per_step": args.prompts},
        "trainer": {"bf16_autocast": False}, "algorithm": {"routing_replay": replay},
        "eval": {"before": False, "after": False}})
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.monotonic()
        traingym.train(cfg, run_dir=Path(tmp) / "run", progress=False)
        wall = time.monotonic() - t0
        events = read_events(Path(tmp) / "run")
    means = {k: _mean(events, k) for k in MEANS}
    shown = ", ".join(f"{k} {v:.3g}" for k, v in means.items() if v is not None)
    print(f"routing_replay {str(replay):5s}: {shown} ({wall:.0f} s)", flush=True)
    return {"routing_replay": replay, "engine_dtype": "bfloat16", "trainer_dtype": "float32",
            "wall_s": wall, "mean_over_trained_steps": means,
            "steps": [{k: e[k] for k in STEP_KEYS if k in e} for e in events]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=None, help="a Qwen3-MoE or Mixtral folder (default: a "
                    "random-init Qwen3-MoE built from the flags below)")
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--experts", type=int, default=16)
    ap.add_argument("--top-k", type=int, default=4)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--prompts", type=int, default=8, help="rollout.prompts_per_step")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (shared machine)")
    ap.add_argument("--seed", type=int, default=0)
    resultfile.add_args(ap)
    args = ap.parse_args()
    rec = resultfile.start("moe_mismatch", args)
    checkout = {"commit_at_start": resultfile.git("rev-parse", "HEAD"),
                "uncommitted_changes_at_start": bool(
                    resultfile.git("status", "--porcelain", "--untracked-files=no"))}
    with tempfile.TemporaryDirectory() as tmp:
        model = args.model or build_model(Path(tmp) / "model", args)
        rows = [run_one(model, replay, args) for replay in (False, True)]
    shape = ({"path": args.model} if args.model else
             {"random_init": "Qwen3-MoE", "hidden": args.hidden, "layers": args.layers,
              "experts": args.experts, "top_k": args.top_k})
    rec.write({**checkout, "date": time.strftime("%Y-%m-%d"), "model": shape,
               "steps": args.steps, "prompts_per_step": args.prompts, "group_size": 4,
               "seed": args.seed, "threads": args.threads, "runs": rows})


if __name__ == "__main__":
    main()
