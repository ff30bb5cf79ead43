"""A code-execution environment: the policy writes a function, hidden tests grade it in a sandbox.

Rows come from envs/code_problems.py (or any rows with prompt, entry, inputs, expected and an
optional prefill). The prompt is rendered with the chat template and pre-filled with the row's
`prefill` (e.g. "```python\\ndef add("); the program is that pre-fill plus the completion up to
the closing fence. It runs in a sandbox from a warm pool (sandbox/pool.py) and the reward is
the fraction of hidden tests passed, judged on the host (envs/code_grader.py).

The pool is made on first use, one per run, event loop, backend and limits (envs/resources.py:
the run owns it), and shared by every env of the run on that loop (the rollout runner keeps one
loop for the whole run); it is closed with the runner. The backend is named
explicitly; "bwrap" is the default. A backend that cannot run raises SandboxUnavailable: code is
never run on the host instead. `image` (sandbox/images.py: requirements, lock, files) is the
Python the code runs against, built once and cached; None is the standard library only. Pools
are keyed by backend, limits and image. On a Ray cluster with `cluster.sandbox_workers`, the sessions
run on the sandbox workers' CPU nodes instead (cluster/ray_sandboxes.py: the engine's run
resources hold the workers' client); this code is the same.
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
