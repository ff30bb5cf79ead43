"""LLM judges (envs/judge.py, issue 16 acceptance 5): a judge-scored task trains on the tiny
preset with the judge served through the engine seam, (a) by the `openai` engine pointed at a
small in-test OpenAI-compatible server that answers fixed text, (b) by the built-in torch
engine on the tiny model; failed judge calls (an HTTP error, a timeout), nonsense answers and
the three on_failure policies are recorded per sample; parse rules checked by hand."""

from __future__ import annotations

import asyncio
import json
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from prereq import require

import traingym
from traingym.envs.judge import JudgeError
from traingym.envs.judge_config import JudgeConfig, ParseFailure, parse_score

ANSWER = re.compile(r"Student answer: (.*?)\n\nIs the student", re.S)


# -- parse rules, by hand ----------------------------------------------------------------

@pytest.mark.parametrize("rule,text,score", [
    ("yes_no", "Yes.", 1.0), ("yes_no", "no, it is wrong", 0.0),
    ("yes_no", "  **YES** it is", 1.0), ("yes_no", "\nNo", 0.0),
    ("number", "Score: 7/10", 7.0), ("number", "-2.5 points", -2.5),
    ("number", "about .5", 0.5), ("number", "-.25 or so", -0.25), ("number", "1e3", 1000.0),
    ("regex:Score: (\\d+)", "Reasoning 3 steps. Score: 8", 8.0),
    ("regex:\\d+\\.\\d+", "about 0.75 or so", 0.75),
])
def test_parse_rules(rule, text, score):
    assert parse_score(rule, text) == score


@pytest.mark.parametrize("rule,text,why", [
    ("yes_no", "Nope, yesterday", "does not start with the word 'yes' or 'no'"),
    ("yes_no", "", "does not start with the word"),
    ("yes_no", "I think YES, not no", "does not start with the word"),  # the first word only
    ("yes_no", "Nope... no", "does not start with the word"),
    ("yes_no", "yesno", "does not start with the word"),
    ("number", "seven", "no number"),
    ("number", "Score: 1e999", "not finite"),
    ("regex:Score: (\\d+)", "Score: high", "does not match"),
    ("regex:Score: (\\w+)", "Score: high", "not a number"),
])
def test_parse_failures(rule, text, why):
    with pytest.raises(ParseFailure, match=why):
        parse_score(rule, text)


# -- a small OpenAI-compatible server answering fixed text --------------------------------

class FakeJudge:
    """/v1/models, /tokenize and /v1/completions over the tiny tokenizer. mode 'ok': 'yes'
    when the student answer in the judge prompt has a digit, else 'no'; 'nonsense': 'banana';
    'http500': status 500; 'slow': answers after 2 s."""

    def __init__(self):
        from traingym.models.loader import tiny_tokenizer

        self.tok = tiny_tokenizer()
        self.mode, self.requests = "ok", 0
        judge = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def _send(self, code, body):
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                self._send(200, {"data": [{"id": "judge"}]})

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if self.path == "/tokenize":
                    return self._send(200, {"tokens": judge.tok.encode(
                        body["prompt"], add_special_tokens=False)})
                judge.requests += 1
                if judge.mode == "http500":
                    return self._send(500, {"error": {"message": "judge is down"}})
                if judge.mode == "slow":
                    time.sleep(2)
                text = judge.answer(judge.tok.decode(body["prompt"]))
                ids = judge.tok.encode(text, add_special_tokens=False)
                self._send(200, {"choices": [{
                    "index": 0, "text": text, "finish_reason": "stop", "token_ids": ids,
                    "logprobs": {"tokens": [f"token_id:{i}" for i in ids],
                                 "token_logprobs": [-0.5] * len(ids)}}]})

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def answer(self, prompt: str) -> str:
        if self.mode == "nonsense":
            return "banana"
        student = ANSWER.search(prompt).group(1)
        digit = any(c.isdigit() for c in student)
        return "yes" if digit else ("banana" if self.mode == "partial" else "no")


@pytest.fixture(scope="module")
def fake():
    require("httpx", "the openai engine needs httpx (the test extra installs it)")
    server = FakeJudge()
    yield server
    server.server.shutdown()


def _judge(fake, **kw) -> dict:
    return {"model": "tiny", "engine": "openai",
            "engine_options": {"base_url": fake.url, "retries": 0, "timeout_s": 30},
            **kw}


def _cfg(judge: dict, **top):
    return traingym.build_config("tiny", overrides={
        "steps": 2, "eval": {"num_prompts": 4}, "task": {"judge": judge}, **top})


def _lines(path):
    return [json.loads(x) for x in path.read_text().splitlines()]


def test_trains_with_an_openai_endpoint_judge(tmp_path, fake):
    fake.mode = "ok"
    run = tmp_path / "run"
    cfg = _cfg(_judge(fake, on_failure="score:0"),
               observability={"samples_per_step": 4})
    result = traingym.train(cfg, run_dir=run, progress=False)
    events = _lines(run / "events.jsonl")
    assert [e["step"] for e in events] == [1, 2]
    samples = _lines(run / "samples.jsonl")
    assert len(samples) == 2 * 4 * 4
    for s in samples:
        (rec,) = [i["judge"] for i in s["env_info"]]
        student = ANSWER.search(rec["prompt"]).group(1)
        assert student == "The answer is" + s["completion"]  # task.prefill + completion
        assert rec["answer"] == ("yes" if any(c.isdigit() for c in student) else "no")
        assert rec["failure"] is None and rec["score"] == rec["reward"] == s["reward"]
        assert rec["batch"] == 16  # one engine call for the step's 4 groups x 4 samples
    assert {s["reward"] for s in samples} <= {0.0, 1.0}
    assert "after" in result.eval
    res = traingym.evaluate(run)  # `traingym eval` of the run: judged the same way
    assert res.summary["num_prompts"] == 4
    for r in res.records:
        (rec,) = [i["judge"] for i in r["env_info"]]
        assert rec["reward"] == r["reward"] and rec["batch"] == (4 if r["mode"] == "greedy"
                                                                 else 4 * 2)  # x samples


def test_trains_with_the_builtin_engine_on_the_tiny_model(tmp_path):
    """The judge is the tiny random model on the built-in torch engine: its answers are
    noise, so some parse as a number and some do not; each is recorded as what it was."""
    run = tmp_path / "run"
    judge = {"model": "tiny", "parse": "number", "on_failure": "score:-1", "max_tokens": 6,
             "temperature": 1.0}
    traingym.train(_cfg(judge, observability={"samples_per_step": 4}), run_dir=run,
                   progress=False)
    samples = _lines(run / "samples.jsonl")
    assert len(samples) == 32
    parsed = 0
    for s in samples:
        (rec,) = [i["judge"] for i in s["env_info"]]
        assert rec["batch"] == 16 and isinstance(rec["answer"], str)
        assert "dropped" not in s  # on_failure='score:-1' never drops
        if rec["failure"] is None:
            parsed += 1
            assert rec["score"] == parse_score("number", rec["answer"])
            assert s["reward"] == rec["reward"] == rec["score"]
        else:
            assert rec["failure"].startswith("unparseable: no number")
            assert not re.search(r"\d", rec["answer"])
            assert rec["score"] is None and s["reward"] == rec["reward"] == -1.0
    # the seeded noise gives both outcomes: each branch above was checked on real answers
    assert 0 < parsed < len(samples), f"{parsed} of {len(samples)} judge answers parsed"


def test_a_run_checkpoint_judges(tmp_path):
    """model = a run's checkpoint folder: its trained weights are loaded over the run's base
    model for the judge's built-in engine."""
    import torch
    from safetensors.torch import load_file

    from traingym.envs.judge import build_judge

    base = tmp_path / "base"
    cfg = traingym.build_config("tiny", overrides={"steps": 1, "eval": {"before": False,
                                                                          "after": False}})
    traingym.train(cfg, run_dir=base, progress=False)
    (ckpt,) = (base / "checkpoints").glob("step_*")
    judge = build_judge(JudgeConfig(model=str(ckpt), parse="number", on_failure="score:0"))
    try:
        saved = load_file(str(ckpt / "model.safetensors"))
        served = judge.engine.model.state_dict()
        name = "model.layers.0.mlp.up_proj.weight"
        dt = served[name].dtype  # the engine's dtype (bf16 where the CPU has bf16 kernels)
        assert torch.equal(served[name], saved[name].to(dt))
        from traingym.models.loader import load_policy

        untrained = load_policy("tiny", seed=0)[0].state_dict()[name]
        assert not torch.equal(untrained, saved[name].float())  # the step changed it
        assert not torch.equal(untrained.to(dt), served[name])  # ... also in the engine dtype
    finally:
        asyncio.run(judge.close())


# -- failures, driven by hand through the env --------------------------------------------

def _episodes(cfg: JudgeConfig, completions: list[str]):
    """Step one JudgeEnv per completion concurrently; (results, the judge used)."""
    from traingym.core.types import Completion
    from traingym.envs.judge import JudgeMaker
    from traingym.envs.render import PromptRenderer
    from traingym.envs.resources import RunResources
    from traingym.models.loader import tiny_tokenizer

    tok = tiny_tokenizer()
    renderer = PromptRenderer(tok, "The answer is")
    rows = [{"prompt": f"What is {i} + 1?", "answer": i + 1} for i in range(len(completions))]
    envs = [JudgeMaker(cfg)(row, renderer) for row in rows]

    async def go():
        async with RunResources() as res:
            for env in envs:
                await env.reset()
            steps = [env.step(Completion((), ids, [0.0] * len(ids), "stop", 0))
                     for env, ids in zip(envs, (tok.encode(c) for c in completions))]
            out = await asyncio.gather(*steps, return_exceptions=True)
            judges = [v for k, v in res._kept.items() if k[1][0] == "judge"]
            return out, judges

    return asyncio.run(go())


def test_judge_calls_are_batched_per_turn(fake):
    fake.mode, before = "ok", fake.requests
    results, (judge,) = _episodes(JudgeConfig(**_judge(fake)), [" 3", " x", " 12", " y"])
    assert judge.calls == 1 and fake.requests - before == 4
    assert [r.reward for r in results] == [1.0, 0.0, 1.0, 0.0]
    assert all(r.info["judge"]["batch"] == 4 for r in results)


def test_nonsense_answers_score_as_configured(fake):
    fake.mode = "nonsense"
    results, _ = _episodes(JudgeConfig(**_judge(fake, on_failure="score:0.25")), [" 3", " x"])
    for r in results:
        rec = r.info["judge"]
        assert r.reward == 0.25 and rec["reward"] == 0.25 and rec["score"] is None
        assert rec["answer"] == "banana"
        assert rec["failure"] == \
        "unparseable: the answer 'banana' does not start with the word 'yes' or 'no'"
    results, _ = _episodes(JudgeConfig(**_judge(fake, on_failure="drop")), [" 3"])
    assert results[0].drop.startswith("judge: unparseable")
    assert "drop" not in results[0].info and results[0].info["judge"]["reward"] is None


def test_a_failing_judge_call_is_recorded(fake):
    fake.mode = "http500"
    results, _ = _episodes(JudgeConfig(**_judge(fake, on_failure="score:-1")), [" 3", " 4"])
    for r in results:
        rec = r.info["judge"]
        assert r.reward == -1.0 and rec["answer"] is None
        assert rec["failure"].startswith("judge call failed: ") and "judge is down" in \
            rec["failure"]


def test_a_judge_timeout_is_recorded(fake):
    fake.mode = "slow"
    results, _ = _episodes(JudgeConfig(**_judge(fake, on_failure="drop", timeout_s=0.5)),
                           [" 3"])
    assert results[0].info["judge"]["failure"] == "timeout: no answer within timeout_s=0.5"
    assert results[0].drop == "judge: timeout: no answer within timeout_s=0.5"
    fake.mode = "ok"


def test_on_failure_error_stops_the_run_naming_the_sample(tmp_path, fake):
    fake.mode = "nonsense"
    try:
        with pytest.raises(JudgeError, match=r"(?s)the judge failed on a sample \(unparseable"
                           r".*example: \{'prompt': 'What is .*completion: 'The answer is.*"
                           r"on_failure"):
            traingym.train(_cfg(_judge(fake), eval={"before": False, "num_prompts": 4}),
                           run_dir=tmp_path / "run", progress=False)
    finally:
        fake.mode = "ok"


def test_on_failure_drop_leaves_the_groups_out(tmp_path, fake):
    """The judge says 'yes' to answers with a digit and nonsense to the others: a group with
    a failed judgement is left out even when its rewards differ."""
    fake.mode = "partial"
    run = tmp_path / "run"
    try:
        cfg = _cfg(_judge(fake, on_failure="drop"), steps=2,
                   eval={"before": False, "after": False})
        traingym.train(cfg, run_dir=run, progress=False)
    finally:
        fake.mode = "ok"
    samples = _lines(run / "samples.jsonl")
    assert len(samples) == 32  # every group of both steps
    groups: dict = {}
    for s in samples:
        drop = "dropped" in s
        assert drop == (s["env_info"][0]["judge"]["answer"] == "banana")
        if drop:
            assert s["dropped"].startswith("judge: unparseable")
        groups.setdefault((s["step"], s["group"]), []).append((drop, s["reward"]))
    mixed = [g for g in groups.values() if any(d for d, _ in g) and not all(d for d, _ in g)]
    assert mixed, "no group with both a dropped and a judged sample: the test shows nothing"
    for e in _lines(run / "events.jsonl"):
        step_groups = [g for (st, _), g in groups.items() if st == e["step"]]
        with_drop = sum(any(d for d, _ in g) for g in step_groups)
        equal = sum(not any(d for d, _ in g) and len({r for _, r in g}) == 1
                    for g in step_groups)
        assert e["groups_dropped"] == with_drop + equal
        kept = [r for g in step_groups for d, r in g if not d]  # placeholders left out
        assert e["reward_mean"] == pytest.approx(sum(kept) / len(kept))


def test_bad_judge_config_names_the_fix():
    with pytest.raises(traingym.ConfigError, match="may use only"):
        _cfg({"model": "tiny", "prompt": "{question} {completion}"})
    with pytest.raises(traingym.ConfigError, match="'score:<x>'"):
        _cfg({"model": "tiny", "on_failure": "zero"})
    with pytest.raises(traingym.ConfigError, match="task.judge.engine_options for 'openai'"):
        _cfg({"model": "tiny", "engine": "openai"})
    with pytest.raises(traingym.ConfigError, match="not both"):
        traingym.build_config("tiny", overrides={"task": {"judge": {"model": "tiny"},
                                                          "env": "gym:x"}})


def test_the_maker_pickles_for_engine_processes():
    """mode='async' sends the env maker to engine processes (checked by hand: a 2-step async
    tiny run judged all 32 samples of its engine's collection in one call)."""
    import pickle

    from traingym.envs.judge import JudgeMaker

    maker = JudgeMaker(JudgeConfig(model="tiny", parse="regex:Score: (\\d+)"))
    assert pickle.loads(pickle.dumps(maker)) == maker


def test_the_judge_prompt_is_filled_from_the_row():
    from traingym.envs.judge import judge_prompt

    cfg = JudgeConfig(model="tiny", prompt='Q: {prompt} A: {completion} ({answer}) {{"x": 1}}')
    chat = {"prompt": [{"role": "system", "content": "Be brief."},
                       {"role": "user", "content": "2+2?"}], "answer": 4}
    assert judge_prompt(cfg, chat, "4") == \
        'Q: system: Be brief.\nuser: 2+2? A: 4 (4) {"x": 1}'
    with pytest.raises(JudgeError, match="no 'answer' .*task.columns.answer"):
        judge_prompt(cfg, {"prompt": "2+2?"}, "4")
    no_answer = JudgeConfig(model="tiny", prompt="{prompt} -> {completion} {{answer}}")
    assert judge_prompt(no_answer, {"prompt": "2+2?"}, "4") == "2+2? -> 4 {answer}"
    for bad in ("{completion} {answer!r}", "{completion:>9}", "{completion} {answer!s:10}"):
        with pytest.raises(ValueError, match="conversion or format spec"):
            JudgeConfig(model="tiny", prompt=bad)
    with pytest.raises(ValueError, match="not a valid template"):
        JudgeConfig(model="tiny", prompt="{completion")


def test_a_toml_config_names_the_judge(tmp_path):
    from traingym.config.load import build_config

    path = tmp_path / "run.toml"
    path.write_text('[task.judge]\nmodel = "tiny"\nengine = "openai"\n'
                    'engine_options = {base_url = "http://127.0.0.1:9/v1", retries = 0}\n'
                    'parse = "regex:Score: (\\\\d+)"\nscore_range = [0, 10]\n'
                    'on_failure = "drop"\n')
    cfg = build_config("tiny", file=path, overrides=["task.judge.max_tokens=8"])
    j = cfg.task.judge
    assert (j.engine, j.parse, j.score_range, j.on_failure, j.max_tokens) == \
        ("openai", "regex:Score: (\\d+)", (0.0, 10.0), "drop", 8)
    path.write_text('[task.judge]\nmodel = "tiny"\nparse = "score"\n')
    with pytest.raises(traingym.ConfigError, match="task.judge.parse='score': use 'yes_no'"):
        build_config("tiny", file=path)


def test_a_score_outside_the_range_is_a_failure(fake):
    fake.mode = "ok"
    cfg = JudgeConfig(**_judge(fake, score_range=[0.5, 1.0], on_failure="score:0.75"))
    (yes, no), _ = _episodes(cfg, [" 3", " x"])
    assert yes.reward == 1.0 and yes.info["judge"]["failure"] is None
    assert no.reward == 0.75 and no.info["judge"]["answer"] == "no"
    assert no.info["judge"]["failure"] == \
        "unparseable: score 0 is outside score_range [0.5, 1]"
