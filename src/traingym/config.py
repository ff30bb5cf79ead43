"""One typed config per run: the schema (a pydantic section per concern, `Config` over them),
its defaults that work, the presets, and the checks across fields and sections.

Loading (TOML/YAML/JSON files, `--set a.b=c` overrides, presets merged under the user's
values) and the error messages that name the closest valid key: config_load.py. The error
type (ConfigError) and the did-you-mean helpers live here, where the validators use them.
"""

from __future__ import annotations

import difflib
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from traingym.algorithms.config import AlgorithmConfig
from traingym.envs.judge import JudgeConfig
from traingym.trainer.options import DistillConfig, LoraConfig, SftConfig


def closest(word: str, choices) -> str | None:
    """The choice most like `word` (difflib ratio >= 0.6), or None when none is close."""
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return close[0] if close else None


def did_you_mean(word: str, choices) -> str:
    """"; did you mean 'x'?" for the closest of `choices`, or "" when none is close."""
    match = closest(word, choices)
    return f"; did you mean {match!r}?" if match else ""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class ModelConfig(_Strict):
    path: str = Field("embedded", description="'embedded' (SmolLM2-135M-Instruct), 'tiny' (a "
                      "0.1M-param Llama with a tokenizer trained on the fly), or a local HF folder")
    engine_dtype: Literal["auto", "bfloat16", "float32"] = Field(
        "auto", description="dtype of the rollout engine's copy of the weights; 'auto': "
        "bfloat16 where the device has fast bf16 kernels, else float32 (precision.py)")
    preset: str | None = Field(None, description="a model preset (models/presets.py, e.g. "
                               "'qwen3-0.6b'): its rollout.engine, trainer.lr and "
                               "trainer.micro_batch_groups go under the values you set; "
                               "model.path must hold that model (its config.json is checked)")

    @model_validator(mode="after")
    def _preset_matches_path(self) -> ModelConfig:
        if self.preset is not None:
            from traingym.models.presets import check_path

            check_path(self.preset, self.path)  # ConfigError / ValueError name the mismatch
        return self


class TaskConfig(_Strict):
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
        if self.env_args and not (self.env or "").startswith(("verifiers:", "gym:", "openenv:")):
            raise ValueError("task.env_args apply only to task.env = 'verifiers:<env_id>', "
                             "'gym:<id>' or 'openenv:<server>'; a 'module:function' env takes "
                             "its settings itself")
        return self

    @field_validator("name")
    @classmethod
    def _known_task(cls, v: str) -> str:
        from traingym.envs.tasks import TASKS

        if v not in TASKS:
            raise ValueError(f"unknown built-in task {v!r}; choose one of {sorted(TASKS)} "
                             f"(or give task.dataset and task.reward){did_you_mean(v, TASKS)}")
        return v


class RolloutConfig(_Strict):
    engine: str = Field("torch", description="the rollout engine (rollout/registry.py): "
                        "'torch' (built-in), 'vllm', 'sglang', 'openai' (read-only), or a "
                        "'module:Class' path")
    engine_options: dict[str, Any] = Field(
        default_factory=dict, description="the engine's own settings, checked against its "
        "Options model (e.g. vllm: python, gpu_memory_utilization)")
    prompts_per_step: int = Field(16, ge=1, description="prompts (groups) per optimizer step")
    group_size: int = Field(4, ge=2, description="completions sampled per prompt (G)")
    temperature: float = Field(1.0, gt=0, description="training sampling temperature")
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: int = Field(0, ge=0, description="0 disables top-k")
    max_new_tokens: int = Field(8, ge=1)
    max_batch_rows: int = Field(64, ge=1, description="rows the engine decodes at once")
    ignore_eos: bool = Field(False, description="keep sampling past the end-of-turn token, so "
                             "every completion has exactly max_new_tokens (for benchmarks)")
    max_turns: int = Field(8, ge=1, description="policy turns per multi-turn episode; the "
                           "episode ends there (single-turn envs end after one anyway)")
    max_context_tokens: int = Field(2048, ge=2, description="prompt + all turns + environment "
                                    "tokens; an episode ends before its context would pass it")

    @model_validator(mode="after")
    def _known_engine(self) -> RolloutConfig:
        from traingym.rollout import registry

        registry.options(self.engine, self.engine_options)  # ValueErrors name the problem
        return self


class TrainerConfig(_Strict):
    lr: float = Field(1e-5, gt=0)
    weight_decay: float = Field(0.0, ge=0)
    betas: tuple[float, float] = (0.9, 0.99)
    grad_clip: float = Field(1.0, gt=0, description="max global grad norm")
    micro_batch_groups: int = Field(4, ge=1, description="groups per forward/backward pass")
    bf16_autocast: bool | Literal["auto"] = Field(
        "auto", description="bf16 autocast for forward/backward (master weights and optimizer "
        "stay fp32); 'auto': on where the device has fast bf16 kernels (precision.py)")
    data_parallel: int = Field(1, ge=1, description="trainer ranks (world size): rank 0 in "
                               "this process, the others local processes (cluster.type "
                               "'local') or Ray actors ('ray'); each trains on whole groups "
                               "of the batch, gloo on CPU (trainer/distributed.py)")
    parallelism: Literal["ddp", "fsdp2"] = Field(
        "ddp", description="with data_parallel > 1: 'ddp' (a replica per rank, gradients "
        "all-reduced) or 'fsdp2' (torch fully_shard: parameters and optimizer state sharded)")
    dist_timeout_s: float = Field(300.0, gt=0, description="with data_parallel > 1: a rank "
                                  "that does not answer (or a collective that does not "
                                  "finish) within this long fails the step")
    gradient_checkpointing: bool = Field(False, description="recompute each decoder layer in "
                                         "the backward pass (less memory, more compute; the "
                                         "trainer then runs full sequences: trainer/micro.py)")
    micro_batch_tokens: int = Field(0, ge=0, description="cap on tokens per forward/backward "
                                    "pass, splitting groups by samples (trainer/micro.py); 0: "
                                    "micro-batches of micro_batch_groups whole groups")

    @model_validator(mode="after")
    def _parallel(self) -> TrainerConfig:
        if self.data_parallel == 1:
            if {"parallelism", "dist_timeout_s"} & self.model_fields_set:
                raise ValueError("trainer.parallelism and dist_timeout_s apply only with "
                                 "trainer.data_parallel > 1")
            return self
        import torch.distributed as dist

        if not dist.is_available():
            raise ValueError("trainer.data_parallel > 1 needs torch.distributed, which this "
                             "torch build lacks")
        if self.parallelism == "fsdp2":
            try:
                from torch.distributed.fsdp import fully_shard  # noqa: F401
            except ImportError as e:
                raise ValueError("trainer.parallelism='fsdp2' needs torch.distributed.fsdp."
                                 f"fully_shard (torch >= 2.6); this torch has none: {e}") from e
        return self


class EvalConfig(_Strict):
    num_prompts: int = Field(128, ge=0, description="held-out prompts (disjoint from training)")
    samples_per_prompt: int = Field(4, ge=1, description="samples per prompt at the training temperature")
    before: bool = Field(True, description="evaluate the base model before training")
    after: bool = Field(True, description="evaluate the trained model after the last step")
    metric: Literal["sampled", "greedy"] = Field(
        "sampled", description="the held-out metric the run names in advance as its target: "
        "mean reward sampled at the training temperature, or greedy")


class CheckpointConfig(_Strict):
    every: int = Field(0, ge=0, description="save every N steps (0: only the last step)")
    keep: int = Field(2, ge=1, description="how many checkpoints to keep")


class WeightsConfig(_Strict):
    """How the trainer's weights reach the engines after each step: the colocated engine in
    sync mode (weights/colocated.py), engine processes or Ray actors in async mode
    (cluster/local.py, cluster/ray.py)."""

    codec: str = Field("auto", description="'delta' (only what changed, against the engine's "
                       "version), 'full' (every byte), or 'auto' (delta unless full is "
                       "predicted faster from measured rates)")
    transport: str = Field("inproc", description="'inproc' (in memory), 'shm' (/dev/shm), "
                           "'tcp' (sockets) or 'filesystem' (<run dir>/weights), or a "
                           "'module:ATTR' path to a transport record (weights/registry.py); "
                           "'dist' is registered but not selectable in the loop yet")
    anchor_budget: float = Field(1.0, gt=0, description="send a full update (an anchor) once "
                                 "the delta bytes since the last one would pass this x full size")
    timeout_s: float = Field(120.0, gt=0, description="the engine waits at most this long for "
                             "each published version (tcp: also per send), then the run fails")
    dead_after_s: float = Field(10.0, gt=0, description="tcp, shm, filesystem: a sender silent "
                                "this long counts as dead")
    threads: int = Field(1, ge=1, le=64, description="threads the delta codec codes with on the "
                         "trainer and applies with on each engine, each its own shard of the "
                         "state (2 on 2 cores: a 1 GB delta over tcp 1.8x faster, "
                         "BENCHMARKS.md run 8)")

    @field_validator("codec")
    @classmethod
    def _known_codec(cls, v: str) -> str:
        from traingym.weights.colocated import codec_choices

        if v not in codec_choices():
            raise ValueError(f"unknown codec {v!r}; choose one of {codec_choices()}"
                             f"{did_you_mean(v, codec_choices())}")
        return v

    @field_validator("transport")
    @classmethod
    def _known_transport(cls, v: str) -> str:
        from traingym.weights import registry

        transport = registry.get(v)  # UnknownTransport (a ValueError) names the choices
        if transport.not_in_loop:
            raise ValueError(f"weights.transport={v!r} cannot be selected in the training loop:"
                             f" {transport.not_in_loop}; choose one of "
                             f"{registry.loop_choices()}")
        return v


class AsyncConfig(_Strict):
    """Disaggregated mode (`mode: async`, async_loop.py): engines in their own processes stream
    scored groups to the trainer while it trains, within a bound on staleness."""

    max_staleness: int = Field(1, ge=0, description="a group is trained on at step s only if "
                               "every policy token came from version >= s - max_staleness; "
                               "older groups are dropped and counted, never trained on")
    queue_size: int = Field(0, ge=0, description="groups dispatched to engines and not yet "
                            "consumed (in flight or scored and waiting); 0: (max_staleness + 1)"
                            " x rollout.prompts_per_step")
    recycle: bool = Field(True, description="a dropped (too stale) group's prompt is sampled "
                          "again; False: it is skipped and the next prompt is taken")
    engines: int = Field(1, ge=1, description="rollout engine processes (Ray actors with "
                         "cluster.type='ray')")
    engine_timeout_s: float = Field(120.0, gt=0, description="an engine that delivers nothing "
                                    "this long while work is outstanding fails the run")
    inflight_updates: bool = Field(False, description="engines apply new weights between "
                                   "decode steps too, not only between engine calls; each "
                                   "token records the version that sampled it")
    restarts: int = Field(0, ge=0, description="engine processes that may be restarted after "
                          "dying (their in-flight prompts are dispatched again); past that the "
                          "run fails")


class ClusterConfig(_Strict):
    """Where the engines, the trainer's ranks 1.. (trainer.data_parallel) and the sandbox
    workers run (cluster/): local processes, or actors on a Ray cluster (cluster/ray.py,
    trainer/ray_ranks.py, cluster/ray_sandboxes.py; needs the `ray` extra and mode='async')."""

    type: Literal["local", "ray"] = Field("local", description="local: engine processes on "
                                          "this machine; ray: engine actors on a Ray cluster")
    address: str | None = Field(None, description="ray: the cluster to join (host:port of its "
                                "head, or 'auto'); required with type='ray'")
    engine_resources: dict[str, float] = Field(
        default_factory=dict, description="ray: extra resources each engine's placement-group "
        "bundle asks for, beside one CPU (a custom node resource pins engines to those nodes)")
    py_modules: list[str] = Field(default_factory=list, description="ray: local package "
                                  "folders shipped to every engine (runtime_env py_modules): "
                                  "the user's reward and env code not installed on the nodes")
    sandbox_workers: int = Field(0, ge=0, description="ray: sandbox worker actors (one CPU "
                                 "each) that run the envs' sandboxed code on CPU nodes; 0: "
                                 "sandboxes run inside each engine (cluster/ray_sandboxes.py)")
    sandbox_resources: dict[str, float] = Field(
        default_factory=dict, description="ray: extra resources each sandbox worker asks for "
        "(a custom resource of the CPU nodes keeps them off the engines' nodes)")
    trainer_resources: dict[str, float] = Field(
        default_factory=dict, description="ray: extra resources each trainer rank actor "
        "(ranks 1.. of trainer.data_parallel) asks for beside one CPU; rank 0 is the driver")

    @model_validator(mode="after")
    def _ray_only(self) -> ClusterConfig:
        if self.type == "ray" and not self.address:
            raise ValueError("cluster.type='ray' needs cluster.address (the head's host:port, "
                             "or 'auto')")
        if self.type == "local" and (self.address or self.engine_resources or self.py_modules
                                     or self.sandbox_workers or self.sandbox_resources
                                     or self.trainer_resources):
            raise ValueError("cluster.address, engine_resources, py_modules, "
                             "trainer_resources and sandbox_* apply only with "
                             "cluster.type='ray'")
        if self.sandbox_resources and not self.sandbox_workers:
            raise ValueError("cluster.sandbox_resources needs cluster.sandbox_workers > 0")
        return self


class ObservabilityConfig(_Strict):
    sinks: list[str] = Field(default_factory=list, description="metric sinks beside "
                             "events.jsonl (observability/sinks.py): 'tensorboard', 'wandb', "
                             "'mlflow'; each is an extra, and one that fails is reported once "
                             "and dropped, never stopping the run")
    sink_options: dict[str, dict[str, Any]] = Field(
        default_factory=dict, description="per-sink options by sink name, e.g. "
        "{wandb = {project = 'x', mode = 'offline'}}")
    trace: bool = Field(True, description="write trace.json (Chrome/Perfetto trace events: "
                        "a span for every phase on every process)")
    samples_per_step: int = Field(4, ge=0, description="groups per step whose samples are "
                                  "written to samples.jsonl (for the dashboard)")

    @model_validator(mode="after")
    def _sinks_known(self) -> ObservabilityConfig:
        from traingym.observability.sinks import check

        check(self.sinks, self.sink_options)  # names, options, installed extras
        return self


class Config(_Strict):
    model_config = ConfigDict(extra="forbid", validate_assignment=True, validate_by_name=True,
                              validate_by_alias=True, serialize_by_alias=True)

    seed: int = 0
    steps: int = Field(40, ge=1, description="optimizer steps")
    threads: int = Field(0, ge=0, description="torch threads (0: all cores)")
    model: ModelConfig = ModelConfig()
    task: TaskConfig = TaskConfig()
    rollout: RolloutConfig = RolloutConfig()
    trainer: TrainerConfig = TrainerConfig()
    algorithm: AlgorithmConfig = AlgorithmConfig()
    eval: EvalConfig = EvalConfig()
    checkpoint: CheckpointConfig = CheckpointConfig()
    weights: WeightsConfig = WeightsConfig()
    mode: Literal["sync", "async"] = Field("sync", description="sync: generate, then train, "
                                           "in one process; async: engines in other processes "
                                           "keep generating while the trainer trains")
    async_: AsyncConfig = Field(AsyncConfig(), alias="async")
    cluster: ClusterConfig = ClusterConfig()
    lora: LoraConfig = LoraConfig()
    sft: SftConfig = SftConfig()
    distill: DistillConfig = DistillConfig()
    observability: ObservabilityConfig = ObservabilityConfig()

    @model_validator(mode="after")
    def _extras(self) -> Config:
        from traingym.trainer.options import check_extras

        check_extras(self)  # ValueErrors name the problem and the fix
        return self

    @model_validator(mode="after")
    def _importance_on(self) -> Config:
        a = self.algorithm
        off = a.is_correction == "none" or (a.is_correction == "auto" and self.mode == "sync")
        if off and {"is_level", "is_cap"} & a.model_fields_set:
            raise ValueError("algorithm.is_level and is_cap apply only with an importance "
                             "correction: set algorithm.is_correction to 'tis' or 'mis' (its "
                             "default 'auto' is none with mode='sync')")
        if a.kl_coef > 0 and a.kl_in == "reward" and self.trainer.data_parallel > 1:
            raise ValueError("algorithm.kl_in='reward' shapes advantages over the whole batch "
                             "in one process: use kl_in='loss' or trainer.data_parallel=1")
        if a.entropy_coef > 0 and self.trainer.gradient_checkpointing:
            raise ValueError("algorithm.entropy_coef needs the entropy's gradient, which the "
                             "gradient-checkpointing path (trainer/micro.py) does not keep: "
                             "set entropy_coef=0 or trainer.gradient_checkpointing=false")
        return self

    @model_validator(mode="after")
    def _algorithm_can_run(self) -> Config:
        from traingym.algorithms import registry

        registry.get(self.algorithm.name).check(self)  # algorithms/base.py: a ValueError
        return self

    @model_validator(mode="after")
    def _async_needs(self) -> Config:
        if self.mode == "sync" and self.async_.model_fields_set:
            raise ValueError("the 'async' section applies only with mode='async'")
        from traingym.weights import registry

        abilities = registry.get(self.weights.transport).abilities
        if self.mode == "async" and not abilities.crosses_processes:
            raise ValueError(f"mode='async' runs engines in other processes: weights.transport "
                             f"must be {registry.one_of(registry.able('crosses_processes'))} "
                             f"(or another that crosses processes), not "
                             f"{self.weights.transport!r}")
        if self.cluster.type == "ray" and self.mode != "async":
            raise ValueError("cluster.type='ray' places engines apart from the trainer: it "
                             "needs mode='async'")
        if self.cluster.type == "ray" and not abilities.crosses_nodes:
            raise ValueError("cluster.type='ray' sends weights to other nodes: weights.transport"
                             f" must be {registry.one_of(registry.able('crosses_nodes'))} (or "
                             f"another that crosses nodes), not {self.weights.transport!r}")
        return self


PRESETS: dict[str, dict[str, Any]] = {
    "default": {},
    "tiny": {
        "steps": 4,
        "model": {"path": "tiny", "engine_dtype": "float32"},
        "task": {"reward": "traingym.envs.tasks:digit_fraction"},
        "rollout": {"prompts_per_step": 4, "group_size": 4, "max_new_tokens": 4},
        "trainer": {"lr": 1e-3, "bf16_autocast": False},
        "eval": {"num_prompts": 16, "samples_per_prompt": 2},
    },
}


class ConfigError(ValueError):
    """A config that cannot run; the message names the problem and the fix."""
