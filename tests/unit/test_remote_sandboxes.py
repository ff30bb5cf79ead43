"""An engine that installed a sandbox-worker client gets it from pool_for instead of a local
pool, for the env's backend and limits; uninstalled, pool_for is local again."""

import asyncio

from traingym.envs.code_env import GRADING_LIMITS, pool_for
from traingym.sandbox import remote
from traingym.sandbox.pool import SandboxPool


class Client:
    def __init__(self):
        self.asked = []

    def pool(self, backend, limits):
        self.asked.append((backend, limits))
        return "remote pool"


def test_pool_for_uses_the_installed_client_then_local_pools_again():
    client = Client()

    async def main():
        remote.install(client)
        try:
            assert pool_for("bwrap", GRADING_LIMITS) == "remote pool"
        finally:
            remote.install(None)
        local = pool_for("process", GRADING_LIMITS)
        assert isinstance(local, SandboxPool)
        await local.close()

    asyncio.run(main())
    assert client.asked == [("bwrap", GRADING_LIMITS)]
