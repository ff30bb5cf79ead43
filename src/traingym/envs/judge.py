"""LLM judges: a reward from a language model's verdict on each single-turn completion, served by
any engine of the engine seam (rollout/registry.py: torch, vllm, or `openai` at a URL).

Config is `[task.judge]` (envs/judge_config.py): engine, model, a prompt template over
{prompt}, {completion} and {answer}, a parse rule ('yes_no', 'number', 'regex:<pattern>'),
score_range, and `on_failure` ('error' stops the run, 'score:<x>', 'drop' leaves the group
out), so a failed call or unparsable answer is never a silent 0. Each sample's env_info records
the judge's prompt, answer, score, failure and batch size. One turn's judge calls go to the
engine as one `generate` call; one Judge per event loop (envs/resources.py).
Not covered: multi-turn episodes, pairwise or group-relative judging (use task.group_reward),
a judge engine shared across runs.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from traingym.core.types import GenerationRequest, Observation, SamplingParams, StepResult
from traingym.envs import resources
from traingym.envs.judge_config import (
    JudgeConfig,
    ParseFailure,
    parse_score,
    template_fields,
)
from traingym.envs.runner import stream_seed
from traingym.models.families import stop_token_ids
from traingym.rollout.context import EngineContext
from traingym.rollout.registry import build


class JudgeError(RuntimeError):
    """A judge failed with task.judge.on_failure='error' (or a row lacks what the prompt
    template needs); the message names the sample."""


def prompt_text(example: dict[str, Any]) -> str:
    """The row's prompt as the judge reads it: the text, or chat messages as lines."""
    p = example.get("prompt", "")
    if isinstance(p, str):
        return p
    return "\n".join(f"{m.get('role', '?')}: {m.get('content', '')}" for m in p)


def judge_prompt(cfg: JudgeConfig, example: dict[str, Any], completion: str) -> str:
    if "answer" in template_fields(cfg.prompt) and "answer" not in example:
        raise JudgeError(f"task.judge.prompt uses {{answer}} but the row {example!r:.200} has "
                         "no 'answer' (map a column with task.columns.answer, or drop {answer} "
                         "from the template)")
    return cfg.prompt.format(prompt=prompt_text(example), completion=completion,
                             answer=example.get("answer", ""))


@dataclass
class Verdict:
    prompt: str  # the judge's prompt text (the template filled in)
    answer: str | None  # the judge's raw answer; None when the call failed
    score: float | None  # the parsed score; None on failure
    failure: str | None  # why the judgement failed; None when it worked
    batch: int  # samples that shared the engine call

    def record(self, reward: float | None) -> dict[str, Any]:
        return {"prompt": self.prompt, "answer": self.answer, "score": self.score,
                "failure": self.failure, "reward": reward, "batch": self.batch}


class Judge:
    """The judge's engine and tokenizer on one event loop, batching the judgements asked of
    it (module docstring). `calls` counts engine.generate calls (tests, logs)."""

    def __init__(self, cfg: JudgeConfig, engine, tokenizer):
        self.cfg, self.engine, self.tokenizer = cfg, engine, tokenizer
        self.stop_ids = stop_token_ids(tokenizer)
        self.calls = 0
        self._pending: list[tuple[str, asyncio.Future]] = []
        self._flusher: asyncio.Task | None = None
        self._count = 0

    async def judge(self, text: str) -> Verdict:
        """The verdict on one filled-in judge prompt (batched with the other pending ones)."""
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        self._pending.append((text, fut))
        if self._flusher is None:
            self._flusher = loop.create_task(self._flush())
        return await fut

    def _ids(self, text: str) -> tuple[int, ...]:
        if self.cfg.chat:
            text = self.tokenizer.apply_chat_template(
                [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False)
        return tuple(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    async def _flush(self) -> None:
        n = -1
        while n != len(self._pending):  # let every episode stepping now add its request
            n = len(self._pending)
            await asyncio.sleep(0)
        batch, self._pending, self._flusher = self._pending, [], None
        try:
            answers, error = await self._generate([t for t, _ in batch]), None
        except asyncio.TimeoutError:
            answers, error = None, f"timeout: no answer within timeout_s={self.cfg.timeout_s}"
        except asyncio.CancelledError:
            for _, fut in batch:
                fut.cancel()
            raise
        except Exception as e:  # recorded per sample and scored as on_failure says
            answers, error = None, f"judge call failed: {type(e).__name__}: {e}"
        for i, (text, fut) in enumerate(batch):
            if fut.done():
                continue
            if answers is None:
                fut.set_result(Verdict(text, None, None, error, len(batch)))
                continue
            try:
                score, failure = self._check(parse_score(self.cfg.parse, answers[i])), None
            except ParseFailure as e:
                score, failure = None, f"unparseable: {e}"
            fut.set_result(Verdict(text, answers[i], score, failure, len(batch)))

    def _check(self, score: float) -> float:
        r = self.cfg.score_range
        if r is not None and not r[0] <= score <= r[1]:
            raise ParseFailure(f"score {score:g} is outside score_range [{r[0]:g}, {r[1]:g}]")
        return score

    async def _generate(self, texts: list[str]) -> list[str]:
        params = SamplingParams(temperature=self.cfg.temperature,
                                max_new_tokens=self.cfg.max_tokens, stop_token_ids=self.stop_ids)
        requests = []
        for t in texts:
            requests.append(GenerationRequest(self._ids(t), 1, params,
                                              stream_seed(self.cfg.seed, self._count)))
            self._count += 1
        self.calls += 1
        comps = await asyncio.wait_for(self.engine.generate(requests), self.cfg.timeout_s)
        if len(comps) != len(texts) or any(len(c) != 1 for c in comps):
            raise RuntimeError(f"the judge engine returned {[len(c) for c in comps]} "
                               f"completions for {len(texts)} requests of 1")
        return [self.tokenizer.decode(c[0].token_ids, skip_special_tokens=True) for c in comps]

    async def close(self) -> None:
        self.engine.close()


def build_judge(cfg: JudgeConfig) -> Judge:
    """The judge's engine through the engine registry (rollout/registry.py `build`), from an
    EngineContext of the judge's section: on the judge's model (models/spec.py: a checkpoint
    folder's weights loaded over its run's base model) or, for an engine that takes no
    weights, with the tokenizer of `cfg.model` only."""
    ctx = EngineContext(engine=cfg.engine, options=dict(cfg.engine_options), model=cfg.model,
                        dtype=cfg.dtype, seed=cfg.seed)
    engine, tok = build(ctx)
    return Judge(cfg, engine, tok)


def outcome(cfg: JudgeConfig, verdict: Verdict, example: dict[str, Any],
            completion: str) -> tuple[float, dict[str, Any], str | None]:
    """(reward, step info, drop reason) for one verdict under `cfg.on_failure`; JudgeError for
    'error'."""
    if verdict.failure is None:
        return verdict.score, {"judge": verdict.record(verdict.score)}, None
    if cfg.on_failure == "error":
        raise JudgeError(f"the judge failed on a sample ({verdict.failure})\n  example: "
                         f"{example!r:.300}\n  completion: {completion!r:.300}\n  judge answer: "
                         f"{verdict.answer!r:.300}\nfix the judge, or set task.judge.on_failure "
                         "to 'score:<x>' or 'drop' to go on past failed judgements")
    if cfg.on_failure == "drop":
        return 0.0, {"judge": verdict.record(None)}, f"judge: {verdict.failure}"
    x = float(cfg.on_failure[len("score:"):])
    return x, {"judge": verdict.record(x)}, None


class JudgeEnv:
    """One single-turn episode scored by the run's judge (module docstring)."""

    def __init__(self, example: dict[str, Any], renderer, cfg: JudgeConfig):
        self.example, self.renderer, self.cfg = example, renderer, cfg
        self._obs = None
        self._done = False

    async def reset(self):
        self._obs = Observation(self.renderer.ids(self.example), self.renderer.text(self.example))
        return self._obs

    async def step(self, completion):
        if self._obs is None or self._done:
            raise RuntimeError("JudgeEnv is single-use: reset() once, then step() once")
        self._done = True
        tok = self.renderer.tokenizer
        text = self.renderer.prefill + tok.decode(completion.token_ids, skip_special_tokens=True)
        judge = resources.current().keep_on_loop(
            ("judge", self.cfg.model_dump_json()), lambda: build_judge(self.cfg),
            lambda j: j.close())
        verdict = await judge.judge(judge_prompt(self.cfg, self.example, text))
        reward, info, drop = outcome(self.cfg, verdict, self.example, text)
        return StepResult(reward=reward, done=True, info=info, drop=drop)


@dataclass
class JudgeMaker:
    """Picklable env maker `(example, renderer) -> JudgeEnv` for one judge config."""

    cfg: JudgeConfig

    def __call__(self, example: dict[str, Any], renderer) -> JudgeEnv:
        return JudgeEnv(example, renderer, self.cfg)
