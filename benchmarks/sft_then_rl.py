"""SFT warm start then GRPO in one config and run directory, against GRPO alone.

The SFT data: --chats conversations "What is a + b?" -> "The answer is a+b." (a, b < 10, a
JSONL written to a temporary folder). Run 1: `sft` section (--sft-steps steps of 8
conversations, lr --sft-lr) then --steps GRPO steps; run 2: the same GRPO steps without the
SFT phase. Both evaluate the held-out set before training (the base model) and after; run 1
also after the SFT phase (eval_after_sft.json). Figures: the SFT phase's first and last loss,
held-out means and paired deltas, to a new result file, labelled with the model unless --label
says otherwise, with its provenance (benchmarks/resultfile.py: the commit, the load average, ...).

    PYTHONPATH=src .venv/bin/python benchmarks/sft_then_rl.py                # tiny, ~1 min
        # -> benchmarks/results/sft_then_rl/<date>-<commit>-tiny.json
    PYTHONPATH=src .venv/bin/python benchmarks/sft_then_rl.py --model embedded --steps 40 \\
        --sft-lr 1e-5

Not covered: more than one seed; a chat set other than this synthetic one.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import resultfile


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="tiny", choices=["tiny", "embedded"])
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--sft-steps", type=int, default=20)
    ap.add_argument("--sft-lr", type=float, default=3e-3)
    resultfile.add_args(ap)
    args = ap.parse_args()
    args.label = args.label or args.model  # the file says which model: <date>-<commit>-tiny.json
    rec = resultfile.start("sft_then_rl", args)
    import traingym
    from traingym.observability.events import read_events

    preset = "tiny" if args.model == "tiny" else "default"
    ev = {"num_prompts": 32, "samples_per_prompt": 4} if args.model == "tiny" else {}
    record = {"args": vars(args)}
    with tempfile.TemporaryDirectory() as tmp:
        chats = Path(tmp) / "chats.jsonl"
        chats.write_text("".join(json.dumps({"messages": [
            {"role": "user", "content": f"What is {a} + {b}?"},
            {"role": "assistant", "content": f"The answer is {a + b}."}]}) + "\n"
            for a in range(10) for b in range(10)))
        base = {"steps": args.steps, "eval": ev}
        both = traingym.train(traingym.build_config(preset, overrides={
            **base, "sft": {"data": str(chats), "steps": args.sft_steps, "lr": args.sft_lr}}),
            run_dir=Path(tmp) / "sft_rl", progress=False)
        sft_events = [e for e in read_events(both.run_dir) if e.get("phase") == "sft"]
        record["sft_loss_first"], record["sft_loss_last"] = (sft_events[0]["loss"],
                                                             sft_events[-1]["loss"])
        record["sft_then_rl"] = both.eval
        after_sft = both.run_dir / "eval_after_sft.json"
        record["after_sft"] = json.loads(after_sft.read_text()) if after_sft.exists() else None
        rl = traingym.train(traingym.build_config(preset, overrides=base),
                            run_dir=Path(tmp) / "rl", progress=False)
        record["rl_only"] = rl.eval
    rec.write(record)
    print(json.dumps({k: record[k] for k in ("sft_loss_first", "sft_loss_last", "after_sft")},
                     indent=1))
    print("sft+rl", both.eval.get("delta"), "\nrl only", rl.eval.get("delta"))


if __name__ == "__main__":
    main()
