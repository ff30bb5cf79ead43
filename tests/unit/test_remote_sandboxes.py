"""An engine whose run resources hold a sandbox-worker client gets it from pool_for instead of a
local pool, for the env's backend and limits; resources without one give a local pool."""

import asyncio

from traingym.envs.code_env import GRADING_LIMITS, pool_for
from traingym.envs.resources import RunResources
from traingym.sandbox.pool import SandboxPool


class Client:
    def __init__(self):
        self.asked = []

    def pool(self, backend, limits):
        self.asked.append((backend, limits))
        return "remote pool"


def test_pool_for_uses_the_runs_client_and_local_pools_without_one():
    client = Client()

    async def main():
        async with RunResources(sandboxes=client):
            assert pool_for("bwrap", GRADING_LIMITS) == "remote pool"
        async with RunResources() as resources:
            local = pool_for("process", GRADING_LIMITS)
            assert isinstance(local, SandboxPool)
        assert local.closed and resources.closed  # closed with the block

    asyncio.run(main())
    assert client.asked == [("bwrap", GRADING_LIMITS)]
