"""LoRA on the embedded model: held-out reward, and adapter-only against merged weight sync.

1. Reward: `traingym.train` with model.path 'embedded' (the default run's task and settings,
   --steps steps), `lora.rank = --rank`, `lora.alpha = 2 x rank`, `trainer.lr = --lr` (LoRA
   needs a larger rate than full fine-tuning), `lora.sync = 'adapter'`; the held-out figures
   before and after (greedy and sampled, paired over prompts, with standard errors) from its
   results.json. Target (issue 13, acceptance 3): sampled delta >= +0.15 and > 3 SE.
2. Sync: the same configuration for --sync-steps steps with `lora.sync = 'merged'`, and the
   figures of the reward run's first --sync-steps steps: per step sync_bytes, sync_full_bytes
   and the seconds of the weight sync (events.jsonl `seconds_sync`: cast, encode, send,
   verify, engine update; for 'adapter' the engine's merge too), medians over the steps.

Writes a new result file (benchmarks/resultfile.py) with `commit_at_start` (read first: the
checkout is shared; provenance's commit is read when the file is written), the config overrides
and the figures, and its provenance (the load average at start and end, ...).

    PYTHONPATH=src .venv/bin/python benchmarks/lora.py          # the default run's length
        # -> benchmarks/results/lora/<date>-<commit>.json
    PYTHONPATH=src .venv/bin/python benchmarks/lora.py --model tiny --steps 3 --sync-steps 2 \\
        --out /tmp/lora_smoke.json                                         # smoke, seconds

Not covered: more than one seed; QLoRA (not offered: trainer/lora.py); adapter sync to engine
processes (async mode), which the config refuses.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import resultfile


def run(overrides: dict, run_dir: Path) -> tuple[dict, list[dict]]:
    import traingym
    from traingym.observability.events import read_events

    cfg = traingym.build_config(overrides=overrides)
    result = traingym.train(cfg, run_dir=run_dir, progress=False)
    return result.eval, read_events(run_dir)


def sync_figures(events: list[dict], n: int) -> dict:
    ev = [e for e in events if e.get("phase") != "sft"][:n]
    return {"steps": len(ev),
            "sync_bytes_median": statistics.median(e["sync_bytes"] for e in ev),
            "sync_full_bytes": ev[-1]["sync_full_bytes"],
            "seconds_sync_median": statistics.median(e["seconds_sync"] for e in ev),
            "codecs": sorted({e["sync_codec"] for e in ev})}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="embedded")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--sync-steps", type=int, default=5)
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--lr", type=float, default=2e-4)
    resultfile.add_args(ap)
    args = ap.parse_args()
    rec = resultfile.start("lora", args)
    commit = resultfile.git("rev-parse", "--short", "HEAD")
    base = {"model": {"path": args.model}, "trainer": {"lr": args.lr},
            "lora": {"rank": args.rank, "alpha": 2.0 * args.rank}}
    if args.model == "tiny":
        base["task"] = {"reward": "traingym.envs.tasks:digit_fraction"}
        base["eval"] = {"num_prompts": 16, "samples_per_prompt": 2}
    record: dict = {"commit_at_start": commit, "args": vars(args)}
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.monotonic()
        adapter = {**base, "steps": args.steps, "lora": {**base["lora"], "sync": "adapter"}}
        ev_report, events = run(adapter, Path(tmp) / "adapter")
        record["reward"] = {"overrides": adapter, "eval": ev_report,
                            "seconds": time.monotonic() - t0}
        d = ev_report.get("delta", {}).get("sampled")
        if d:
            record["reward"]["target_met"] = bool(d["delta"] >= 0.15 and d["delta"] > 3 * d["se"])
        merged = {**base, "steps": args.sync_steps, "eval": {**base.get("eval", {}),
                                                             "before": False, "after": False},
                  "lora": {**base["lora"], "sync": "merged"}}
        _, merged_events = run(merged, Path(tmp) / "merged")
        record["sync"] = {"adapter": sync_figures(events, args.sync_steps),
                          "merged": sync_figures(merged_events, args.sync_steps)}
    rec.write(record)
    print(json.dumps({"sync": record["sync"], "delta": record["reward"]["eval"].get("delta")},
                     indent=1))


if __name__ == "__main__":
    main()
