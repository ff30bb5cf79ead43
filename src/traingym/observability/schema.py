"""The schema of a run directory's records: events.jsonl (one record per step) and
samples.jsonl (a few episodes per step). docs/events.md is generated from this file
(`python -m traingym.observability.schema > docs/events.md`; a test checks they agree).

Every record carries `"schema": SCHEMA_VERSION`. The version goes up when a field changes
meaning or type or a required field goes away; adding an optional field keeps it. A reader
that sees a newer version than it knows should say so rather than guess.

A key is documented either by name (FIELDS) or by a family prefix (FAMILIES: keys whose set
depends on the codec, transport, cluster or the utilisation summary). `check_record` says
what is wrong with a record: a required key missing, a key no field or family documents, or a
value of the wrong type.
"""

from __future__ import annotations

from dataclasses import dataclass

SCHEMA_VERSION = 1

TYPES = {
    "int": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "float": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "bool": lambda v: isinstance(v, bool),
    "str": lambda v: isinstance(v, str),
    "list": lambda v: isinstance(v, list),
    "dict": lambda v: isinstance(v, dict),
    "any": lambda v: True,
}


@dataclass(frozen=True)
class Field:
    name: str
    type: str  # a TYPES key; "float?" also allows null
    meaning: str
    required: bool = False

    def accepts(self, value) -> bool:
        if self.type.endswith("?") and value is None:
            return True
        return TYPES[self.type.rstrip("?")](value)


def F(name, type, meaning, required=False):
    return Field(name, type, meaning, required)


STEP_FIELDS = [
    F("schema", "int", "schema version of this record (SCHEMA_VERSION)", True),
    F("step", "int", "steps done after this one (1-based); 0 in SFT records", True),
    F("reward_mean", "float", "mean reward over the step's samples not dropped (NaN when "
      "every one was)", True),
    F("reward_std", "float", "population std of those rewards", True),
    F("loss", "float", "the algorithm's loss, mean over micro-batches", True),
    F("kl", "float", "KL estimate to the reference policy (0 without one)", True),
    F("entropy", "float", "mean token entropy of the policy on the batch", True),
    F("clip_frac", "float", "fraction of tokens whose ratio was clipped", True),
    F("mismatch_abs_logp", "float?", "mean |trainer logp - engine logp| over policy tokens "
      "(train/inference mismatch); null on a step that trained on nothing", True),
    F("mismatch_kl_k3", "float?", "k3 KL estimate between engine and trainer token "
      "distributions; null on a step that trained on nothing", True),
    F("is_weight_mean", "float", "mean importance weight (algorithm.is_correction on)"),
    F("is_zero_frac", "float", "fraction of tokens with importance weight 0 (masked)"),
    F("is_capped_frac", "float", "fraction of tokens whose importance weight was capped"),
    # mixture-of-experts policies whose engine reports routes (trainer/replay.py)
    F("moe_route_mismatch", "float?", "fraction of routed (token, MoE layer) pairs whose "
      "expert set in the trainer's forward differs from the engine's (0 with "
      "algorithm.routing_replay); null when no pair was compared"),
    F("moe_router_mismatch", "float?", "the same for the experts the trainer's router would "
      "choose (equals moe_route_mismatch without routing replay)"),
    F("moe_aux_loss", "float", "the family's load-balancing loss over the positions that "
      "predict policy tokens, before algorithm.moe_aux_loss_coef (only when it is > 0; "
      "trainer/moe_aux.py)"),
    # algorithms with a value head (algorithm.name='ppo', algorithms/ppo.py)
    F("value_loss", "float", "ppo: value loss 0.5 max((V-R)^2, (V_clip-R)^2), mean over policy "
      "tokens (before vf_coef)"),
    F("value_clip_frac", "float", "ppo: fraction of policy tokens whose clipped value term was "
      "the larger"),
    F("value_mean", "float", "ppo: mean value-head output V over the batch's policy tokens, "
      "before the update"),
    F("value_return_mean", "float", "ppo: mean GAE return (advantage + V) over policy tokens"),
    F("value_explained_var", "float?", "ppo: 1 - Var(return - V) / Var(return) over policy "
      "tokens, before the update (null when the returns do not vary)"),
    F("grad_norm", "float", "gradient norm before clipping", True),
    F("trained_tokens", "int", "policy tokens in the loss", True),
    F("lr", "float", "learning rate of the step", True),
    F("completion_len_mean", "float", "mean policy tokens per sample", True),
    F("completion_len_max", "int", "most policy tokens in one sample", True),
    F("turns_mean", "float", "mean policy turns per episode", True),
    F("groups", "int", "groups sampled this step (all rounds)", True),
    F("groups_kept", "int", "groups in the batch (with signal, within the cut)", True),
    F("groups_dropped", "int", "groups left out of the batch", True),
    F("sample_rounds", "int", "sampling rounds of the step (dynamic sampling only)"),
    F("gen_tokens", "int", "policy tokens generated this step", True),
    F("gen_tokens_per_s", "float", "gen_tokens / seconds_rollout", True),
    F("tokens_per_s", "float", "gen_tokens / seconds_step", True),
    F("checkpoint_saved", "bool", "a checkpoint was committed after this step", True),
    F("policy_version", "int", "oldest policy version among the step's policy tokens", True),
    F("elapsed_s", "float", "seconds since the run (or its resume) started", True),
    F("prompt_indices", "list", "async: stream positions of the step's prompts"),
    F("trainer_idle_frac", "float", "async: fraction of the step the trainer waited for groups"),
    # SFT-phase records (trainer/sft.py)
    F("phase", "str", "'sft' in SFT-phase records; absent in RL step records"),
    F("sft_step", "int", "SFT: steps done in the SFT phase"),
    F("sft_steps", "int", "SFT: steps of the SFT phase"),
    F("eval_after_sft", "dict", "SFT: held-out means after the SFT phase, by metric"),
]

STEP_FAMILIES = {
    "seconds_": ("float", "wall seconds of a phase of the step: rollout, train, sync, "
                 "checkpoint, step"),
    "sync_": ("any", "weight sync figures of the step: version, codec, reason, bytes, "
              "full_bytes, changed_frac, corrupt, resyncs, and the seconds of each stage "
              "(cast_s, encode_s, send_s, apply_s, engine_s, publish_s); which appear depends "
              "on the sync path (weights/)"),
    "async_": ("any", "async loop figures: staleness_mean/max, out, dropped, dropped_indices, "
               "dropped_total, skipped_total, engine_version, engine_restarts, redispatched, "
               "ignored_results, and on the last step unfinished and final_weights (engine, "
               "version, hash)"),
    "util_": ("float?", "utilisation summary of the step: busy fractions and seconds per "
              "component (docs/observability.md, 'Trace and utilisation')"),
    "wait_": ("float?", "seconds of the step a component waited on another "
              "(docs/observability.md, 'Trace and utilisation')"),
}

SAMPLE_FIELDS = [
    F("schema", "int", "schema version of this record (SCHEMA_VERSION)", True),
    F("sid", "str", "stable id: '<step>-<group index>-<member>'", True),
    F("step", "int", "the step (same numbering as events.jsonl's `step`)", True),
    F("group", "int", "the prompt's position in the training stream (Group.index)", True),
    F("member", "int", "which of the group's G samples", True),
    F("reward", "float", "the sample's reward", True),
    F("prompt", "str", "the rendered first prompt", True),
    F("completion", "str", "everything after the prompt, decoded (policy and environment "
      "turns)", True),
    F("finish_reason", "str", "stop | length | max_turns | max_context", True),
    F("turns", "int", "policy turns in the episode", True),
    F("tokens", "int", "policy tokens in the episode", True),
    F("example", "dict", "the dataset row the sample answers", True),
    F("messages", "list", "multi-turn episodes: the completion split into turns, "
      "[{'role': 'policy'|'env', 'text'}]; absent for single-turn episodes"),
    F("tool_calls", "list", "tool calls in the policy's turns, in the Hermes format (ToolTask's "
      "default parser): [{'turn', 'name', 'arguments'} or {'turn', 'error'}]; absent when "
      "none"),
    F("env_info", "list", "per environment step that reported any, the JSON-safe part of "
      "StepResult.info (a code env's sandbox verdict: status, details; an LLM judge's "
      "{'judge': {prompt, answer, score, failure, reward, batch}}, envs/judge.py); absent "
      "when none"),
    F("dropped", "str", "why the sample is neither trained on nor counted (StepResult.drop: "
      "a judge that failed under on_failure='drop'; its reward is a placeholder); absent when "
      "not dropped"),
]


def check_record(record: dict, fields: list[Field],
                 families: dict[str, tuple[str, str]] | None = None) -> list[str]:
    """What is wrong with `record` against `fields` and `families` (empty: nothing)."""
    by_name = {f.name: f for f in fields}
    problems = [f"missing required key {f.name!r}" for f in fields
                if f.required and f.name not in record and record.get("phase") != "sft"]
    for key, value in record.items():
        field = by_name.get(key)
        if field is None:
            prefix = next((p for p in families or {} if key.startswith(p)), None)
            if prefix is None:
                problems.append(f"undocumented key {key!r}")
                continue
            field = Field(key, families[prefix][0], "")
        if not field.accepts(value):
            problems.append(f"{key!r} should be {field.type}, got {value!r:.60}")
    return problems


def check_step(record: dict) -> list[str]:
    if record.get("phase") == "sft":
        need = ("schema", "phase", "step", "sft_step", "sft_steps", "loss")
        missing = [f"missing required key {k!r}" for k in need if k not in record]
        return missing + check_record(record, STEP_FIELDS, STEP_FAMILIES)
    return check_record(record, STEP_FIELDS, STEP_FAMILIES)


def check_sample(record: dict) -> list[str]:
    return check_record(record, SAMPLE_FIELDS)


def _table(fields: list[Field]) -> str:
    rows = ["| key | type | required | meaning |", "|---|---|---|---|"]
    rows += [f"| `{f.name}` | {f.type} | {'yes' if f.required else ''} | "
             f"{f.meaning.replace('|', chr(92) + '|')} |"
             for f in fields]
    return "\n".join(rows)


def markdown() -> str:
    """docs/events.md."""
    families = "\n".join(f"| `{p}*` | {t} | {m} |" for p, (t, m) in STEP_FAMILIES.items())
    return f"""# Run records: events.jsonl and samples.jsonl (schema {SCHEMA_VERSION})

Generated from `src/traingym/observability/schema.py` by
`python -m traingym.observability.schema > docs/events.md`; `tests/observability/test_schema.py`
fails when this file and the code disagree, and checks real sync and async runs' records
against it.

Every record of both files carries `"schema": {SCHEMA_VERSION}`. The version goes up when a
field changes meaning or type or a required field goes away; a new optional field keeps it.
Types: int, float (an int is accepted), bool, str, list, dict; a `?` also allows null.

## events.jsonl: one record per step

Written by `observability/events.py` (RunLog) after each step, sync and async alike, before
the sinks (TensorBoard, W&B, MLflow) get the record's numbers. SFT-phase records
(`"phase": "sft"`) need only `schema`, `phase`, `step` (0), `sft_step`, `sft_steps`, `loss`.

{_table(STEP_FIELDS)}

Families: keys that start with these prefixes; which ones appear depends on the sync path, the
loop and the cluster.

| prefix | type | meaning |
|---|---|---|
{families}

## samples.jsonl: a few episodes per step

`observability.samples_per_step` groups per step (0: none), every sample of each group.

{_table(SAMPLE_FIELDS)}
"""


if __name__ == "__main__":
    print(markdown(), end="")
