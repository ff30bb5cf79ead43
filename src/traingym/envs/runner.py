"""Collect groups of scored episodes: G envs per prompt, one batched engine call per turn.

The G episodes of a prompt share its first observation, so the first turn samples all G in one
request and prefills once; later turns extend each episode's own token context
(envs/transcript.py checks the prefix). All live episodes go to the engine together; env steps
run concurrently. An episode ends on done, `max_turns`, or `max_context_tokens` (then the env's
next observation is dropped, so every sample ends with policy tokens). A sample's reward is the
sum of its step rewards, optionally rescored per group. The runner makes its run's resources
current in every episode (envs/resources.py).
Not covered: continuous batching (a slow env step holds up every episode's next turn);
episodes that branch or rewrite their context.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import json
import math
import threading
import warnings
from dataclasses import dataclass
from typing import Any

from traingym.core import trace
from traingym.core.types import Completion, GenerationRequest, Group, SamplingParams, StepResult
from traingym.envs.base import EnvFactory
from traingym.envs.group import GroupReward, score_group
from traingym.envs.resources import RunResources
from traingym.envs.transcript import ContextError, Transcript

CLOSE_TIMEOUT_S = 60.0  # closing env resources (a sandbox pool) must not hang a finished run


async def _close_one(env) -> Exception | None:
    try:
        got = env.close()
        if inspect.isawaitable(got):
            await got
    except Exception as e:  # reported by close_envs
        return e
    return None


async def close_envs(envs: list) -> None:
    """Call each env's optional `close()` (envs/base.py; awaited when it is async), all
    together, once its episodes are over or the collection failed. A close that raises, or
    closes still running after CLOSE_TIMEOUT_S (then cancelled), are reported as a warning:
    they must neither hide the collection's own error nor fail a finished collection."""
    todo = [e for e in envs if callable(getattr(e, "close", None))]
    if not todo:
        return
    try:
        results = await asyncio.wait_for(asyncio.gather(*(_close_one(e) for e in todo)),
                                         CLOSE_TIMEOUT_S)
    except asyncio.TimeoutError:
        warnings.warn(f"closing {len(todo)} envs took over {CLOSE_TIMEOUT_S:.0f} s; the "
                      "unfinished closes were cancelled", RuntimeWarning, stacklevel=2)
        return
    failed = [r for r in results if r is not None]
    if failed:
        warnings.warn(f"{len(failed)} of {len(todo)} envs failed to close; the first: "
                      f"{failed[0]!r}", RuntimeWarning, stacklevel=2)


async def _all(calls):
    """asyncio.gather, except that a failure cancels the other calls and waits for them
    before it is raised: no env call still runs when the collection's envs are closed."""
    tasks = [asyncio.ensure_future(c) for c in calls]
    try:
        return await asyncio.gather(*tasks)
    except BaseException:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise


async def _traced(name: str, call):
    """Await an env call inside its span (each runs as its own task: its own trace lane)."""
    with trace.span(name, cat="env"):
        return await call


def json_safe(info: dict[str, Any]) -> dict[str, Any]:
    """The entries of an env's StepResult.info that JSON can hold (kept for samples.jsonl);
    others (a Sample, an open handle) are left out."""
    out = {}
    for k, v in info.items():
        try:
            json.dumps(v)
        except (TypeError, ValueError):
            continue
        out[str(k)] = v
    return out


def stream_seed(*parts: int) -> int:
    """A 63-bit seed from integers (stable across processes and Python versions)."""
    h = 1469598103934665603
    for p in parts:
        h = ((h ^ (p & 0xFFFFFFFFFFFFFFFF)) * 1099511628211) & 0x7FFFFFFFFFFFFFFF
    return h


@dataclass(frozen=True)
class EpisodeLimits:
    max_turns: int = 1  # policy turns per episode
    max_context_tokens: int | None = None  # prompt + completions + env tokens; None: no limit


@dataclass
class _Episode:
    index: int  # the example's position in the training stream
    member: int  # which of the G samples
    env: Any
    example: dict[str, Any]
    prompt_text: str
    transcript: Transcript
    reward: float = 0.0
    finish: str | None = None
    infos: list[dict[str, Any]] = dataclasses.field(default_factory=list)  # json_safe(info)
    drop: str | None = None  # a step's StepResult.drop: the reward is unknown


class RolloutRunner:
    def __init__(self, engine, factory: EnvFactory, params: SamplingParams, group_size: int, *,
                 tokenizer, limits: EpisodeLimits = EpisodeLimits(),
                 group_reward: GroupReward | None = None,
                 resources: RunResources | None = None):
        self.engine, self.factory = engine, factory
        # the run's env resources (envs/resources.py), current in every episode; None: own ones
        self.owns_resources = resources is None
        self.resources = RunResources() if resources is None else resources
        self.params, self.group_size = params, group_size
        self.tokenizer, self.limits, self.group_reward = tokenizer, limits, group_reward
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._current = None  # the running collect's future

    def collect(self, examples: list[tuple[int, dict[str, Any]]], seed: int) -> list[Group]:
        """Run one collection on the runner's event loop, which lives in a background thread
        for the whole run: what envs keep across steps (a warm sandbox pool, connections) is
        bound to that loop, and its timers and pipes keep being served while the trainer
        trains (a loop that only ran inside `collect` would see every timeout of its
        background work expire at once when it resumed)."""
        if self._loop is None:
            self._loop = asyncio.new_event_loop()
            self._thread = threading.Thread(target=self._loop.run_forever, daemon=True,
                                            name="traingym-rollouts")
            self._thread.start()
        self._current = asyncio.run_coroutine_threadsafe(self._collect(examples, seed), self._loop)
        return self._current.result()

    async def collect_async(self, examples: list[tuple[int, dict[str, Any]]],
                            seed: int) -> list[Group]:
        """`collect` inside a running event loop (an engine process runs one per group)."""
        return await self._collect(examples, seed)

    def close(self) -> None:
        """Stop the runner's loop, closing what its envs keep on it (the run's resources on
        this loop); resources the runner made itself are closed whole."""
        if self._loop is not None:
            loop, self._loop = self._loop, None
            if self._current is not None and not self._current.done():
                self._current.cancel()  # a collect interrupted by an error or Ctrl-C in the caller
            for coro in (self.resources.close_loop(), loop.shutdown_asyncgens()):
                asyncio.run_coroutine_threadsafe(coro, loop).result(timeout=CLOSE_TIMEOUT_S)
            loop.call_soon_threadsafe(loop.stop)
            self._thread.join()
            loop.close()
        if self.owns_resources and not self.resources.closed:
            self.resources.close()

    def _params(self, context_len: int) -> SamplingParams:
        """The sampling params, with max_new_tokens cut to the room left in the context."""
        limit = self.limits.max_context_tokens
        if limit is None or limit - context_len >= self.params.max_new_tokens:
            return self.params
        return dataclasses.replace(self.params, max_new_tokens=limit - context_len)

    async def _collect(self, examples, seed: int) -> list[Group]:
        with self.resources.use():  # what the envs keep belongs to this runner's run
            return await self._collect_groups(examples, seed)

    async def _collect_groups(self, examples, seed: int) -> list[Group]:
        envs = [[self.factory(row) for _ in range(self.group_size)] for _, row in examples]
        try:
            return await self._episodes(envs, examples, seed)
        finally:
            await close_envs([e for group in envs for e in group])

    async def _episodes(self, envs, examples, seed: int) -> list[Group]:
        obs = [await _all(_traced("env_reset", e.reset()) for e in group)
               for group in envs]
        episodes = []
        for (index, row), group, group_obs in zip(examples, envs, obs):
            if any(o.prompt_ids != group_obs[0].prompt_ids for o in group_obs):
                raise ValueError(f"example {index}: the envs of one group gave different prompts")
            limit = self.limits.max_context_tokens
            if limit is not None and len(group_obs[0].prompt_ids) >= limit:
                raise ValueError(f"example {index}: the prompt has {len(group_obs[0].prompt_ids)}"
                                 f" tokens; rollout.max_context_tokens={limit} leaves no room")
            episodes.append([_Episode(index, g, env, row, o.text, Transcript(tuple(o.prompt_ids)))
                             for g, (env, o) in enumerate(zip(group, group_obs))])
        requests = [
            GenerationRequest(group[0].transcript.prompt_ids, self.group_size,
                              self._params(len(group[0].transcript)), stream_seed(seed, group[0].index))
            for group in episodes
        ]
        with trace.span(*getattr(self.engine, "span", ("generate", "engine")), turn=0):
            completions = await self.engine.generate(requests)
        live = [(ep, c) for group, comps in zip(episodes, completions) for ep, c in zip(group, comps)]
        turn = 1
        while live:
            for ep, c in live:
                ep.transcript.add_policy(c)
            results = await _all(_traced("env_step", ep.env.step(c)) for ep, c in live)
            live = [ep for (ep, c), r in zip(live, results) if self._advance(ep, c, r)]
            if not live:
                break
            requests = [
                GenerationRequest(ep.transcript.context, 1, self._params(len(ep.transcript)),
                                  stream_seed(seed, ep.index, ep.member, turn))
                for ep in live
            ]
            with trace.span(*getattr(self.engine, "span", ("generate", "engine")), turn=turn):
                comps_E = await self.engine.generate(requests)
            live = [(ep, comps[0]) for ep, comps in zip(live, comps_E)]
            turn += 1
        return [self._group(group) for group in episodes]

    def _advance(self, ep: _Episode, completion: Completion, result: StepResult) -> bool:
        """Record a step's result; True if the episode continues with another policy turn."""
        where = f"example {ep.index}, sample {ep.member}, turn {ep.transcript.turns}"
        r = result.reward
        if isinstance(r, bool) or not isinstance(r, (int, float)) or not math.isfinite(r):
            raise ValueError(f"{where}: env {type(ep.env).__name__} returned reward {r!r}; it "
                             "must be a finite float")
        ep.reward += float(r)
        if result.info:
            ep.infos.append(json_safe(result.info))
        if result.drop:
            ep.drop = ep.drop or str(result.drop)
        if result.done:
            ep.finish = completion.finish_reason
            return False
        if ep.transcript.turns >= self.limits.max_turns:
            ep.finish = "max_turns"
            return False
        if result.next_observation is None:
            raise ContextError(f"{where}: env {type(ep.env).__name__} returned done=False "
                               "without a next_observation")
        try:
            new = ep.transcript.env_tokens(result.next_observation.prompt_ids)
        except ContextError as e:  # re-raised naming the episode
            raise ContextError(f"{where}: {e}") from None
        limit = self.limits.max_context_tokens
        if limit is not None and len(ep.transcript) + len(new) >= limit:
            ep.finish = "max_context"
            return False
        ep.transcript.add_env(new)
        return True

    def _group(self, episodes: list[_Episode]) -> Group:
        samples = [ep.transcript.to_sample(ep.example, self.tokenizer, ep.prompt_text, ep.finish,
                                           ep.reward) for ep in episodes]
        for sample, ep in zip(samples, episodes):
            sample.env_info = [i for i in ep.infos if i]
            sample.drop_reason = ep.drop
        if self.group_reward is not None:
            for sample, value in zip(samples, score_group(self.group_reward, samples)):
                sample.reward = value
        return Group(samples=samples, index=episodes[0].index)
