"""On-policy distillation with the teacher behind the engine seam (distill.teacher_engine,
trainer/teacher.py): the built-in engine as the teacher trains exactly as the local teacher
(same per-step kl and loss within 1e-5 on the same seeds), and the student moves towards the
teacher (the exact reverse KL(student || teacher), summed over the vocabulary, on fixed
contexts, drops); config errors name the problem and the engines that can teach. vLLM and
OpenAI-server teachers: their scores are checked in tests/engines/test_score.py and
tests/engines/test_openai_engine.py."""

from __future__ import annotations

import pytest
import torch

import traingym
from traingym.trainer.teacher import load_teacher
from traingym.core.errors import ConfigError
from traingym.observability.events import read_events

NO_EVAL = {"before": False, "after": False}


@pytest.fixture(scope="module")
def teacher_run(tmp_path_factory):
    """A teacher: the tiny preset trained 6 steps (a checkpoint the student has not seen)."""
    run_dir = tmp_path_factory.mktemp("teacher") / "t"
    traingym.train(traingym.build_config("tiny", overrides={
        "steps": 6, "trainer": {"lr": 3e-3}, "eval": NO_EVAL}), run_dir=run_dir, progress=False)
    return run_dir


def _student(teacher, run_dir, **distill):
    return traingym.train(traingym.build_config("tiny", overrides={
        "steps": 3, "trainer": {"lr": 3e-3}, "eval": NO_EVAL,
        "distill": {"teacher": str(teacher), **distill}}), run_dir=run_dir, progress=False)


@torch.no_grad()
def _reverse_kl(student, teacher, contexts) -> float:
    """Mean over completion positions of KL(student || teacher), the full distributions."""
    total, n = 0.0, 0
    for prompt, completion in contexts:
        ids = torch.tensor([list(prompt) + list(completion)])
        s = student(ids).logits[0, len(prompt) - 1: -1].log_softmax(-1)
        t = teacher(ids).logits[0, len(prompt) - 1: -1].log_softmax(-1)
        total += float((s.exp() * (s - t)).sum())
        n += len(completion)
    return total / n


def test_an_engine_teacher_trains_as_the_local_teacher(teacher_run, tmp_path):
    from traingym.envs.render import PromptRenderer
    from traingym.envs.tasks import builtin_task
    from traingym.models.loader import load_policy
    from traingym.rollout.torch_engine import TorchEngine
    from traingym.core.types import GenerationRequest, SamplingParams

    _student(teacher_run, tmp_path / "local")
    _student(teacher_run, tmp_path / "engine", teacher_engine="torch")
    local, engine = read_events(tmp_path / "local"), read_events(tmp_path / "engine")
    assert len(local) == len(engine) == 3
    for a, b in zip(local, engine):  # same samples, same teacher log-probs, same updates
        assert b["kl"] == pytest.approx(a["kl"], abs=1e-5)
        assert b["loss"] == pytest.approx(a["loss"], abs=1e-5)
    cfg = traingym.build_config("tiny")
    before, tok = load_policy("tiny", seed=cfg.seed)  # the student's start
    renderer = PromptRenderer(tok, cfg.task.prefill, cfg.task.system_prompt)
    prompts = [renderer.ids(r) for r in builtin_task("arith").heldout[:16]]
    comps = TorchEngine(before, tok.pad_token_id).generate_sync(
        [GenerationRequest(p, 2, SamplingParams(1.0, max_new_tokens=8), seed=i)
         for i, p in enumerate(prompts)])
    contexts = [(c.prompt_ids, c.token_ids) for cs in comps for c in cs]
    teacher = load_teacher(str(teacher_run), "tiny")
    after = load_teacher(str(tmp_path / "engine"), "tiny")  # the student's last checkpoint
    kl_before = _reverse_kl(before, teacher, contexts)
    kl_after = _reverse_kl(after, teacher, contexts)
    print(f"reverse KL to the teacher: before {kl_before:.4f}, after {kl_after:.4f}")
    assert kl_after < 0.6 * kl_before, (kl_before, kl_after)


@pytest.mark.parametrize("distill, rollout, match", [
    ({"teacher": "tiny", "teacher_engine": "sglang"}, {},
     "cannot score given tokens.*use 'openai' or 'torch' or 'vllm'"),
    ({"teacher": "tiny", "teacher_engine": "vlm"}, {}, "did you mean 'vllm'"),
    ({"teacher": "tiny", "teacher_engine": "torch", "teacher_engine_options": {"fusd": True}},
     {}, "distill.teacher_engine_options for 'torch': 'fusd'.*did you mean 'fused'"),
    ({"teacher_engine": "torch"}, {}, "apply only with distill.teacher"),
    ({"teacher": "http://127.0.0.1:9/v1", "teacher_engine": "openai"}, {"temperature": 0.7},
     "scores only at temperature 1, but rollout.temperature=0.7.*use 'torch' or 'vllm'"),
    ({"teacher": "http://127.0.0.1:9/v1", "teacher_engine": "openai",
      "teacher_engine_options": {"base_url": "http://x/v1"}}, {}, "set it there, not in"),
    ({"teacher": "tiny", "teacher_engine": "openai"}, {}, "distill.teacher='tiny' is not a "
     "server URL"),
])
def test_teacher_engine_config_errors(distill, rollout, match):
    with pytest.raises(ConfigError, match=match):
        traingym.build_config("tiny", overrides={"distill": distill, "rollout": rollout})


def test_an_openai_teacher_at_temperature_one_is_a_valid_config():
    cfg = traingym.build_config("tiny", overrides={"distill": {
        "teacher": "http://127.0.0.1:9/v1", "teacher_engine": "openai",
        "teacher_engine_options": {"model": "teacher"}}, "rollout": {"temperature": 1.0}})
    assert cfg.distill.teacher_engine == "openai"
