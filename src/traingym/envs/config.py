"""The `task` and `eval` config sections: rows, reward or env, judge; the held-out evaluation."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from traingym.core.errors import Strict, did_you_mean
from traingym.envs import adapters
from traingym.envs.judge_config import JudgeConfig
from traingym.envs.tasks import TASKS


class TaskConfig(Strict):
    name: str = Field("arith", description="built-in task (envs/tasks.py): 'arith' "
                      "(single-digit a+b, a-b, a*b) or 'add2' (a+b for a, b in 0..19); its "
                      "rows are unused when `dataset` is given")
    dataset: str | None = Field(None, description="training rows: a JSONL file, a local "
                                "`datasets` folder (save_to_disk) or a hub dataset 'hf:owner/name'"
                                "; each row needs 'prompt' (see `columns`)")
    eval_dataset: str | None = Field(None, description="held-out rows, same format")
    columns: dict[str, str] = Field({}, description="dataset column for each field, e.g. "
                                    "{prompt = 'question', answer = 'solution'}; fields: prompt, "
                                    "answer, messages (a list-of-chat-messages column used as the "
                                    "prompt); unmapped fields keep their own names")
    split: str | None = Field(None, description="split of a DatasetDict folder or hub dataset "
                              "to train on; None: 'train'")
    eval_split: str | None = Field(None, description="split of task.dataset to evaluate on "
                                   "(when task.eval_dataset is not given)")
    reward: str | None = Field(None, description="'module:function' taking a Sample, returning "
                               "float (the single-turn env; unused when `env` is given)")
    env: str | None = Field(None, description="'module:function' or 'module:Class' building an "
                            "Env from (example, renderer), e.g. a MultiTurnEnv subclass; or "
                            "'gym:<id>' for a Gymnasium text env (envs/gym_text.py); or "
                            "'verifiers:<env_id>' for a verifiers environment "
                            "(envs/verifiers_env.py); or 'openenv:<module:app or URL>' for an "
                            "OpenEnv server (envs/openenv_env.py); or 'harbor' for Harbor task "
                            "folders (task.dataset = 'harbor:<folder>', envs/harbor.py); None: "
                            "the single-turn env over `reward`")
    env_args: dict[str, Any] = Field({}, description="keyword arguments of a 'verifiers:' env's "
                                     "load_environment, a 'gym:' env's gymnasium.make or an "
                                     "'openenv:' env's OpenEnvMaker (action_field, "
                                     "observation_field, app_dir, startup_s, step_timeout_s)")
    judge: JudgeConfig | None = Field(None, description="an LLM judge scores each completion "
                                      "(envs/judge.py: engine, model, prompt, parse, "
                                      "on_failure); task.reward is then unused")
    group_reward: str | None = Field(None, description="'module:function' taking the G samples "
                                     "of a group, returning their G rewards (optional)")
    prefill: str = Field("The answer is", description="text the assistant turn starts with")
    system_prompt: str | None = Field(None, description="system message; None keeps the "
                                      "chat template's default")

    @field_validator("columns")
    @classmethod
    def _known_columns(cls, v: dict[str, str]) -> dict[str, str]:
        fields = ("prompt", "answer", "messages")
        bad = [k for k in v if k not in fields]
        if bad:
            raise ValueError(f"task.columns: unknown field(s) {bad}; map any of {list(fields)} to "
                             f"a dataset column, e.g. {{prompt = 'question'}}"
                             f"{did_you_mean(bad[0], fields)}")
        if "prompt" in v and "messages" in v:
            raise ValueError("task.columns maps both prompt and messages: the prompt is one "
                             "column, either text (prompt) or a list of chat messages (messages)")
        return v

    @model_validator(mode="after")
    def _judge_or_env(self) -> TaskConfig:
        if self.judge is not None and self.env is not None:
            raise ValueError("task.judge scores a single-turn completion and task.env brings "
                             "its own scoring: set one of them, not both")

        adapter = adapters.find(self.env)
        if self.env_args and not (adapter and adapter.abilities.takes_env_args):
            raise ValueError(f"task.env_args apply only to task.env = "
                             f"{adapters.usages('takes_env_args')}; a 'module:function' env "
                             "takes its settings itself")
        return self

    @field_validator("name")
    @classmethod
    def _known_task(cls, v: str) -> str:
        if v not in TASKS:
            raise ValueError(f"unknown built-in task {v!r}; choose one of {sorted(TASKS)} "
                             f"(or give task.dataset and task.reward){did_you_mean(v, TASKS)}")
        return v


class EvalConfig(Strict):
    num_prompts: int = Field(128, ge=0, description="held-out prompts (disjoint from training)")
    samples_per_prompt: int = Field(4, ge=1, description="samples per prompt at the training temperature")
    before: bool = Field(True, description="evaluate the base model before training")
    after: bool = Field(True, description="evaluate the trained model after the last step")
    metric: Literal["sampled", "greedy"] = Field(
        "sampled", description="the held-out metric the run names in advance as its target: "
        "mean reward sampled at the training temperature, or greedy")
