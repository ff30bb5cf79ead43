"""On-policy distillation end to end: train a teacher, then distil an untrained student from it.

1. Teacher: `traingym.train` on --model for --teacher-steps steps at --lr (the run's own task:
   'tiny' uses the tiny preset's digit_fraction reward, 'embedded' the arith task).
2. Student: the same untrained starting model, --student-steps steps with
   `distill.teacher = <teacher run dir>`, `distill.coef = 1`, `distill.reward_coef = 0` (the
   task reward is not used in the loss), same lr.
Held-out figures before/after of both runs (paired over prompts, SEs) and each distillation
step's mean reverse-KL estimate (`kl`) go to a new result file, labelled with the model
unless --label says otherwise, with its provenance (benchmarks/resultfile.py: the commit, the
load average, ...).

    PYTHONPATH=src .venv/bin/python benchmarks/distill.py                    # tiny, ~1 min
        # -> benchmarks/results/distill/<date>-<commit>-tiny.json
    PYTHONPATH=src .venv/bin/python benchmarks/distill.py --model embedded --teacher-steps 40 \\
        --student-steps 20 --lr 1e-5

Not covered: more than one seed; a teacher of another family or size (same tokenizer needed).
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
    ap.add_argument("--teacher-steps", type=int, default=16)
    ap.add_argument("--student-steps", type=int, default=8)
    ap.add_argument("--lr", type=float, default=3e-3)
    resultfile.add_args(ap)
    args = ap.parse_args()
    args.label = args.label or args.model  # the file says which model: <date>-<commit>-tiny.json
    rec = resultfile.start("distill", args)
    import traingym
    from traingym.observability.events import read_events

    preset = "tiny" if args.model == "tiny" else "default"
    ev = {"num_prompts": 32, "samples_per_prompt": 4} if args.model == "tiny" else {}
    record = {"args": vars(args)}
    with tempfile.TemporaryDirectory() as tmp:
        t = traingym.train(traingym.build_config(preset, overrides={
            "steps": args.teacher_steps, "eval": ev, "trainer": {"lr": args.lr}}),
            run_dir=Path(tmp) / "teacher", progress=False)
        s = traingym.train(traingym.build_config(preset, overrides={
            "steps": args.student_steps, "eval": ev, "trainer": {"lr": args.lr},
            "distill": {"teacher": str(Path(tmp) / "teacher"), "coef": 1.0}}),
            run_dir=Path(tmp) / "student", progress=False)
        record["teacher"] = t.eval
        record["student"] = s.eval
        record["student_kl_per_step"] = [e["kl"] for e in read_events(s.run_dir)]
    rec.write(record)
    print(json.dumps({"teacher": t.eval.get("delta"), "student": s.eval.get("delta")}, indent=1))


if __name__ == "__main__":
    main()
