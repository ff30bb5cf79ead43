"""A code-execution environment: the policy writes a function, hidden tests grade it in a sandbox.

Rows come from envs/code_problems.py (or any rows with prompt, entry, inputs, expected and an
optional prefill); the program is the pre-fill plus the completion up to the closing fence. The
reward is the fraction of hidden tests passed, judged on the host (envs/code_grader.py). The
warm pool (sandbox/pool.py) belongs to the run (envs/resources.py), keyed by backend, limits and
image (sandbox/images.py). A backend that cannot run raises SandboxUnavailable: code never runs
on the host instead. With `cluster.sandbox_workers` the sessions run on the sandbox workers
(cluster/ray_sandboxes.py); this code is the same.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from traingym.core.types import Completion, Observation, StepResult
from traingym.envs.code_grader import extract_code, grade
from traingym.envs.render import PromptRenderer
from traingym.envs.resources import current
from traingym.sandbox import DEFAULT_BACKEND, Limits, open_sandbox
from traingym.sandbox.images import ImageSpec
from traingym.sandbox.pool import SandboxPool

GRADING_LIMITS = Limits(cpu_s=2, wall_s=5, memory_bytes=256 << 20, processes=16,
                        file_bytes=1 << 20, output_bytes=256 << 10)


def pool_for(backend: str, limits: Limits, image: ImageSpec | None = None,
             links: tuple[tuple[str, str], ...] = ()) -> SandboxPool:
    """The current run's pool for this event loop, backend, limits, image and sandbox `links`
    (bwrap: top-level paths into the sandbox, as Harbor's /app; envs/harbor.py); when the run's
    sandboxes run on sandbox workers (a Ray cluster), their client's pool instead (neither
    images nor links there yet: a ValueError)."""
    resources = current()
    image = ImageSpec.parse(image)
    links = tuple(links)
    if resources.sandboxes is not None:
        if not image.empty or links:
            raise ValueError("sandbox images and links (Harbor tasks) are not supported on Ray "
                             "sandbox workers yet (cluster.sandbox_workers); drop the image "
                             "(or the Harbor task) or the workers")
        return resources.sandboxes.pool(backend, limits)
    options = {"image": image, **({"links": links} if links else {})}
    return resources.keep_on_loop(
        ("code_env.pool", backend, limits, image, links),
        lambda: SandboxPool(lambda: open_sandbox(backend, limits, **options), min_ready=2,
                            max_size=8),
        SandboxPool.close)


class CodeEnv:
    """One single-turn episode: write the function, get the fraction of hidden tests passed."""

    def __init__(self, example: dict[str, Any], renderer: PromptRenderer,
                 backend: str = DEFAULT_BACKEND, limits: Limits = GRADING_LIMITS,
                 image: ImageSpec | dict | None = None):
        for key in ("prompt", "entry", "inputs", "expected"):
            if key not in example:
                raise KeyError(f"code rows need {key!r}; got keys {sorted(example)}")
        self.example, self.renderer = example, renderer
        self.backend, self.limits = backend, limits
        self.image = ImageSpec.parse(image)
        self.prefill = example.get("prefill", "")
        self.verdict = None

    async def reset(self) -> Observation:
        text = self.renderer.render(self.renderer.messages(self.example)) + self.prefill
        return Observation(self.renderer.encode(text), text)

    async def step(self, completion: Completion) -> StepResult:
        if self.verdict is not None:
            raise RuntimeError("CodeEnv is single-use: reset() once, then step() once")
        text = self.renderer.tokenizer.decode(completion.token_ids, skip_special_tokens=True)
        code = extract_code(text, self.prefill)
        pool = pool_for(self.backend, self.limits, self.image)
        async with pool.session() as sandbox:
            self.verdict = await grade(sandbox, code, self.example["entry"],
                                       self.example["inputs"], self.example["expected"])
        return StepResult(reward=self.verdict.reward, done=True,
                          info={"status": self.verdict.status, "details": self.verdict.details[:3]})


@dataclass(frozen=True)
class CodeEnvMaker:
    """Picklable env maker `(example, renderer) -> CodeEnv` with a chosen backend and image
    (an ImageSpec or a mapping such as {"requirements": ["numpy"]}, checked here)."""

    backend: str = DEFAULT_BACKEND
    image: ImageSpec | dict | None = None

    def __post_init__(self):
        object.__setattr__(self, "image", ImageSpec.parse(self.image))

    def __call__(self, example: dict[str, Any], renderer: PromptRenderer) -> CodeEnv:
        return CodeEnv(example, renderer, self.backend, image=self.image)


def code_env(example: dict[str, Any], renderer: PromptRenderer) -> CodeEnv:
    """The default maker (bwrap), for `task.env: traingym.envs.code_env:code_env`."""
    return CodeEnv(example, renderer)
