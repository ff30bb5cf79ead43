"""The `algorithm` config section: which algorithm (algorithms/registry.py) and its knobs.

A knob left at None takes the chosen algorithm's own default (each algorithm file's
`DEFAULTS`; algorithms/base.py resolves them into `Knobs`), so `algorithm.name = "gspo"`
alone gives GSPO's clip range, and `"dapo"` alone its dynamic sampling and overlong shaping.
An algorithm's own knobs (PPO's gamma, lam, ...) are declared in its file (`Options`) and
set as `algorithm.<key>` like the shared ones.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from traingym.algorithms import registry
from traingym.core.errors import did_you_mean


class AlgorithmConfig(BaseModel):
    """The knobs every algorithm shares; any other key is one of the chosen algorithm's own
    options (its `Options` model, in its file), checked against it here."""

    model_config = ConfigDict(extra="allow", validate_assignment=True)

    name: str = Field("grpo", description="the RL algorithm (algorithms/registry.py): grpo, "
                      "dr_grpo, dapo, gspo, cispo, rloo, reinforce_pp, ppo, or a 'module:Class' "
                      "path")
    normalize_std: bool | None = Field(None, description="divide group advantages by the "
                                       "group's std (None: the algorithm's default)")
    clip_low: float | None = Field(None, ge=0, description="ratio clip below 1 (None: the "
                                   "algorithm's default; grpo 0.2)")
    clip_high: float | None = Field(None, ge=0, description="ratio clip above 1 (None: the "
                                    "algorithm's default; grpo 0.28, DAPO clip-higher)")
    kl_coef: float = Field(0.0, ge=0, description="weight of the KL to the initial (reference) "
                           "model; 0 = off (no reference model is kept)")
    kl_estimator: Literal["k1", "k2", "k3"] = Field(
        "k3", description="KL estimator per token, d = log p_ref - log p: k1 = -d, k2 = d^2/2, "
        "k3 = exp(d) - d - 1 (Schulman 2020)")
    kl_in: Literal["loss", "reward"] = Field(
        "loss", description="'loss': kl_coef x KL added to the per-token loss; 'reward': "
        "subtracted from the reward as a per-token penalty (return-to-go) before the loss")
    entropy_coef: float = Field(0.0, ge=0, description="entropy bonus: the loss minus "
                                "entropy_coef x the per-token entropy of the policy")
    dynamic_sampling: bool | None = Field(None, description="sample more prompts while groups "
                                          "without signal leave the batch short (DAPO; None: "
                                          "the algorithm's default)")
    max_sample_rounds: int = Field(4, ge=1, description="with dynamic_sampling: sampling "
                                   "rounds per step at most; after them the batch trains short")
    overlong_filter: bool | None = Field(None, description="truncated samples (finish_reason "
                                         "'length') carry no loss (DAPO; None: its default)")
    overlong_buffer: int | None = Field(None, ge=0, description="soft overlong penalty: the "
                                        "last this many tokens before rollout.max_new_tokens "
                                        "are penalised linearly; 0 = off (None: the "
                                        "algorithm's default; dapo: max_new_tokens // 5)")
    overlong_penalty: float = Field(1.0, ge=0, description="soft overlong penalty at the "
                                    "length limit (reward - this)")
    is_correction: Literal["auto", "none", "tis", "mis"] = Field(
        "auto", description="importance-sampling correction for the gap between the engine's "
        "log-probs and the trainer's (staleness in async mode, numerics in any mode): "
        "truncated (tis), masked (mis) or none; 'auto': tis with mode='async', none with "
        "mode='sync' (algorithms/importance.py)")
    is_level: Literal["token", "sequence"] = Field("token", description="ratio per token, or "
                                                   "one ratio per sequence (product over tokens)")
    is_cap: float = Field(2.0, ge=1.0, description="tis: weights are cut to this; mis: tokens "
                          "(or sequences) with a weight above it get weight 0")
    routing_replay: bool = Field(False, description="mixture-of-experts policies (Qwen3-MoE, "
                                 "Mixtral, Qwen2-MoE): the trainer's forward sends each token "
                                 "to the experts the engine routed it to, with the trainer's "
                                 "own gate weights over them (R3; trainer/replay.py); needs an "
                                 "engine that reports routes (abilities.reports_routes: 'torch')")
    moe_aux_loss_coef: float = Field(0.0, ge=0, description="mixture-of-experts policies "
                                     "(Qwen3-MoE, Mixtral, Qwen2-MoE): the loss adds this x the "
                                     "family's load-balancing loss (transformers' "
                                     "load_balancing_loss_func) over the positions that predict "
                                     "policy tokens (trainer/moe_aux.py), reported as "
                                     "moe_aux_loss; 0 = off; a dense model is refused")

    @field_validator("name")
    @classmethod
    def _known(cls, v: str) -> str:
        registry.get(v)  # UnknownAlgorithm (a ValueError) names the choices
        return v

    @model_validator(mode="after")
    def _kl(self) -> AlgorithmConfig:
        if self.kl_coef == 0 and {"kl_estimator", "kl_in"} & self.model_fields_set:
            raise ValueError("algorithm.kl_estimator and kl_in apply only with "
                             "algorithm.kl_coef > 0")
        if "max_sample_rounds" in self.model_fields_set and self.dynamic_sampling is False:
            raise ValueError("algorithm.max_sample_rounds applies only with dynamic_sampling")
        return self

    @model_validator(mode="after")
    def _own(self) -> AlgorithmConfig:
        """The other keys are the algorithm's own options; its defaults are recorded too."""
        _own_options(self.name, dict(self.model_extra or {}))
        for key, value in registry.get(self.name).Options().model_dump(mode="json").items():
            self.__pydantic_extra__.setdefault(key, value)  # a default: not in model_fields_set
        return self


def _own_options(name: str, given: dict) -> None:
    """Keys outside the shared knobs must be options of algorithm `name` (its `Options`)."""
    options = registry.get(name).Options
    for key in given:
        if key not in options.model_fields:
            owners = [n for n in registry.names() if key in registry.get(n).Options.model_fields]
            if owners:
                raise ValueError(f"algorithm.{key} applies only to an algorithm that has that "
                                 f"option ({', '.join(owners)}), not {name!r}")
            known = sorted(set(AlgorithmConfig.model_fields) | set(options.model_fields))
            raise ValueError(f"unknown key 'algorithm.{key}'{did_you_mean(key, known)} "
                             f"(keys of algorithm {name!r}: {', '.join(known)})")
    try:
        options(**given)
    except ValidationError as e:
        err = e.errors()[0]
        raise ValueError(f"algorithm.{err['loc'][0]}: {err['msg']} (got {err['input']!r:.60})"
                         ) from None
