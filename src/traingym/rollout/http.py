"""HTTP plumbing shared by the engines that talk to an inference server (openai_engine.py,
sglang_engine.py): one JSON request with retries, bounded concurrency, and errors that name the
URL and the fix.

Connection failures and 5xx answers are retried `retries` times with exponential backoff; a 4xx is
never retried (the request is wrong: `ServerRejected` with the server's message), nor a read timeout
(the server may still be working: `EngineUnavailable`). Async requests use one `httpx.AsyncClient`
per engine call, since a client belongs to its event loop and traingym calls engines from several;
`max_concurrency` is one semaphore per event loop. httpx is imported inside functions, so importing
this module costs nothing.
"""

from __future__ import annotations

import asyncio
import time
import weakref
from dataclasses import dataclass, field
from typing import Any

from traingym.rollout.base import EngineUnavailable

RETRY_STATUSES = frozenset({500, 502, 503, 504})


class ServerRejected(ValueError):
    """The server answered 4xx: the request is wrong for this server (message included)."""

    def __init__(self, message: str, status: int):
        super().__init__(message)
        self.status = status


def need_httpx():
    try:
        import httpx
    except ModuleNotFoundError as e:
        raise ModuleNotFoundError(
            "the HTTP engines need httpx: `pip install 'traingym[http]'` (or `pip install "
            "httpx`)") from e
    return httpx


def server_message(response) -> str:
    """The error text a server put in its answer: OpenAI/vLLM {'error': {'message'}}, vLLM
    {'message'}, FastAPI {'detail'}, or the body itself (cut to 500 characters)."""
    try:
        body = response.json()
    except ValueError:
        return response.text[:500] or f"HTTP {response.status_code}"
    if isinstance(body, dict):
        err = body.get("error")
        if isinstance(err, dict) and err.get("message"):
            return str(err["message"])
        for key in ("message", "detail", "error"):
            if body.get(key):
                return str(body[key])
    return str(body)[:500]


@dataclass
class HttpStats:
    requests: int = 0
    retries: int = 0
    in_flight: int = 0
    peak_in_flight: int = 0


@dataclass
class HttpClient:
    """JSON over HTTP to one server. `name` (e.g. "openai engine") and `fix` (what to do when
    the server cannot be reached) go into every error."""

    base: str  # scheme://host:port, no trailing slash
    name: str
    fix: str
    headers: dict[str, str] = field(default_factory=dict)
    timeout_s: float = 120.0
    connect_timeout_s: float = 5.0
    retries: int = 3
    backoff_s: float = 0.5
    max_concurrency: int = 8
    stats: HttpStats = field(default_factory=HttpStats)

    def __post_init__(self):
        self._sems: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def _timeout(self, timeout_s: float | None):
        httpx = need_httpx()
        return httpx.Timeout(timeout_s or self.timeout_s, connect=self.connect_timeout_s)

    def async_client(self):
        httpx = need_httpx()
        return httpx.AsyncClient(headers=self.headers, timeout=self._timeout(None),
                                 limits=httpx.Limits(max_connections=self.max_concurrency))

    def _semaphore(self) -> asyncio.Semaphore:
        loop = asyncio.get_running_loop()
        sem = self._sems.get(loop)
        if sem is None:
            sem = self._sems[loop] = asyncio.Semaphore(self.max_concurrency)
        return sem

    def _check(self, response, url: str) -> Any:
        if 400 <= response.status_code < 500:
            raise ServerRejected(f"{self.name}: {url} refused the request "
                                 f"(HTTP {response.status_code}): {server_message(response)}",
                                 response.status_code)
        if response.status_code >= 300:
            raise RuntimeError(f"{self.name}: {url} answered HTTP {response.status_code}: "
                               f"{server_message(response)}")
        try:
            return response.json()
        except ValueError as e:
            raise RuntimeError(f"{self.name}: {url} answered with a body that is not JSON: "
                               f"{response.text[:300]!r}") from e

    def _give_up(self, url: str, err: Exception, tries: int) -> EngineUnavailable:
        return EngineUnavailable(f"{self.name}: cannot reach {url} ({type(err).__name__}: "
                                 f"{err}; {tries} tries): {self.fix}")

    def _timed_out(self, url: str, timeout_s: float | None) -> EngineUnavailable:
        return EngineUnavailable(f"{self.name}: {url} gave no answer within "
                                 f"{timeout_s or self.timeout_s:g} s: the server is overloaded "
                                 "or stuck; raise the engine's timeout_s or check the server")

    def _outcome(self, response, url: str, attempt: int, last: bool) -> tuple[bool, Any]:
        """(False, None): retry; (True, body): done; raises on a final failure."""
        if response.status_code in RETRY_STATUSES and not last:
            return False, None
        if response.status_code >= 500:
            raise EngineUnavailable(f"{self.name}: {url} failed (HTTP {response.status_code}, "
                                    f"{attempt + 1} tries): {server_message(response)}; check "
                                    "the server's log")
        return True, self._check(response, url)

    async def request(self, client, method: str, path: str, body: Any = None,
                      timeout_s: float | None = None) -> Any:
        """One JSON request on `client` (from `async_client`), inside the loop's concurrency
        bound, retried as the module docstring says."""
        httpx = need_httpx()
        url = self.base + path
        async with self._semaphore():
            self.stats.in_flight += 1
            self.stats.peak_in_flight = max(self.stats.peak_in_flight, self.stats.in_flight)
            try:
                for attempt in range(self.retries + 1):
                    self.stats.requests += 1
                    last = attempt == self.retries
                    try:
                        r = await client.request(method, url, json=body,
                                                 timeout=self._timeout(timeout_s))
                    except httpx.ReadTimeout:
                        raise self._timed_out(url, timeout_s) from None
                    except httpx.TransportError as e:
                        if last:
                            raise self._give_up(url, e, attempt + 1) from e
                    else:
                        done, value = self._outcome(r, url, attempt, last)
                        if done:
                            return value
                    self.stats.retries += 1
                    await asyncio.sleep(self.backoff_s * 2**attempt)
            finally:
                self.stats.in_flight -= 1
        raise AssertionError("unreachable")

    def request_sync(self, method: str, path: str, body: Any = None,
                     timeout_s: float | None = None, retries: int | None = None) -> Any:
        """`request` for synchronous callers (health, weight updates, start-up checks)."""
        httpx = need_httpx()
        url = self.base + path
        retries = self.retries if retries is None else retries
        with httpx.Client(headers=self.headers, timeout=self._timeout(timeout_s)) as client:
            for attempt in range(retries + 1):
                self.stats.requests += 1
                last = attempt == retries
                try:
                    r = client.request(method, url, json=body)
                except httpx.ReadTimeout:
                    raise self._timed_out(url, timeout_s) from None
                except httpx.TransportError as e:
                    if last:
                        raise self._give_up(url, e, attempt + 1) from e
                else:
                    done, value = self._outcome(r, url, attempt, last)
                    if done:
                        return value
                self.stats.retries += 1
                time.sleep(self.backoff_s * 2**attempt)
        raise AssertionError("unreachable")


def split_base_url(url: str) -> str:
    """'http://h:p', 'http://h:p/' or 'http://h:p/v1' -> 'http://h:p' (the server's root)."""
    url = url.strip().rstrip("/")
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"base_url {url!r} must start with http:// or https:// "
                         "(e.g. 'http://127.0.0.1:8000/v1')")
    return url[: -len("/v1")] if url.endswith("/v1") else url
