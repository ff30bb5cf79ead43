"""The dashboard's request guard (an ASGI middleware in front of every route) and its rules.

In order, each failure answered as JSON {"detail": ...}: only GET and HEAD (405; no CORS
preflight); no `..`, `\\`, `//`, NUL or their encodings in the raw path (400; routes take ids,
so this is a second wall); only allowed Host names (400, against DNS rebinding); the token,
when set, as a Bearer header or the cookie a `?token=` page request sets (401, constant time).
Every answer gets nosniff, DENY framing, a strict Content-Security-Policy, no-referrer and
no-store; `Access-Control-*` and `server` headers are dropped. `mask()` replaces config values
whose key names a secret with "***".
"""

from __future__ import annotations

import hmac
import ipaddress
import re
import socket
from pathlib import Path
from urllib.parse import parse_qsl, urlencode

from traingym.core.asgi import send_json


class StartError(ValueError):
    """A dashboard that cannot start (a bad flag or token file); the message names the fix."""


CSP = ("default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
       "img-src 'self' data:; connect-src 'self'; font-src 'self'; object-src 'none'; "
       "base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
HEADERS = [(b"x-content-type-options", b"nosniff"), (b"x-frame-options", b"DENY"),
           (b"content-security-policy", CSP.encode()), (b"referrer-policy", b"no-referrer"),
           (b"cache-control", b"no-store"), (b"cross-origin-resource-policy", b"same-origin"),
           (b"cross-origin-opener-policy", b"same-origin")]
LOOPBACK_NAMES = {"localhost", "127.0.0.1", "[::1]", "::1"}
BAD_PATH = re.compile(r"\.\.|\\|//|\x00|%2e|%2f|%5c|%00", re.IGNORECASE)
SECRET_WORDS = {"key", "keys", "apikey", "token", "secret", "secrets",
                "password", "passwd", "passphrase", "credential", "credentials", "auth",
                "cookie"}
MIN_TOKEN = 16


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def is_secret_key(key: str) -> bool:
    words = re.split(r"[^a-z0-9]+", re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", key).lower())
    return any(w in SECRET_WORDS or w.endswith(("key", "token", "secret", "password"))
               for w in words if w)


def mask(value):
    """A copy of a JSON value with every value under a secret-naming key replaced by "***"."""
    if isinstance(value, dict):
        return {k: "***" if is_secret_key(str(k)) and v not in (None, "", {}, [])
                else mask(v) for k, v in value.items()}
    if isinstance(value, list):
        return [mask(v) for v in value]
    return value


def read_token(path: str | Path) -> str:
    try:
        token = Path(path).read_text().strip()
    except OSError as e:
        raise StartError(f"--token-file {path}: cannot read it ({e.strerror})") from None
    if len(token) < MIN_TOKEN or any(c.isspace() for c in token):
        raise StartError(f"--token-file {path}: the token must be one word of at least "
                          f"{MIN_TOKEN} characters; make one with: "
                          f"python -c 'import secrets; print(secrets.token_urlsafe(32))' > {path}")
    return token


def allowed_hosts(host: str, extra: list[str] = ()) -> set[str]:
    """Host header names accepted: loopback names, the bind address (and, for a wildcard bind,
    this machine's host names), and `extra`."""
    names = set(LOOPBACK_NAMES) | {h.lower() for h in extra}
    if host in ("0.0.0.0", "::", ""):
        names |= {socket.gethostname().lower(), socket.getfqdn().lower()}
    else:
        names.add(f"[{host}]" if ":" in host else host.lower())
    return names


def host_name(header: str) -> str:
    header = header.strip().lower()
    if header.startswith("["):
        return header[:header.find("]") + 1] if "]" in header else header
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


class Guard:
    def __init__(self, app, hosts: set[str], token: str | None = None):
        self.app, self.hosts, self.token = app, hosts, token

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def send_secure(message):
            if message["type"] == "http.response.start":
                kept = [(k, v) for k, v in message.get("headers", [])
                        if not k.lower().startswith(b"access-control-")
                        and k.lower() not in {b"server", *(h for h, _ in HEADERS)}]
                message = {**message, "headers": kept + HEADERS}
            await send(message)

        refusal = self.refusal(scope)
        if refusal is not None:
            status, text, extra = refusal
            return await send_json(send_secure, status, {"detail": text}, extra)
        return await self.app(scope, receive, send_secure)

    def refusal(self, scope):
        method = scope["method"]
        if method not in ("GET", "HEAD"):
            return 405, f"{method} is not allowed: the dashboard is read-only (GET, HEAD)", \
                [(b"allow", b"GET, HEAD")]
        raw = scope.get("raw_path") or scope["path"].encode()
        if BAD_PATH.search(raw.decode("latin-1")) or BAD_PATH.search(scope["path"]):
            return 400, "the request path holds '..', a backslash, '//' or an encoded " \
                "separator; the dashboard serves runs and files by id", []
        headers = {}
        for k, v in scope.get("headers", []):
            headers.setdefault(k.decode("latin-1").lower(), v.decode("latin-1"))
        host = host_name(headers.get("host", ""))
        if host not in self.hosts:
            return 400, f"Host {host or '(none)'!r} is not allowed here (allowed: " \
                f"{', '.join(sorted(self.hosts))}); start the dashboard with --allow-host " \
                "NAME to add a name", []
        if self.token is None:
            return None
        query = dict(parse_qsl(scope.get("query_string", b"").decode("latin-1")))
        if "token" in query and _same(query["token"], self.token) \
                and not scope["path"].startswith("/api/"):
            rest = urlencode([(k, v) for k, v in query.items() if k != "token"])
            where = scope["path"] + (f"?{rest}" if rest else "")
            return 303, "token accepted", [
                (b"location", where.encode()),
                (b"set-cookie", f"token={self.token}; HttpOnly; SameSite=Strict; Path=/"
                 .encode())]
        auth = headers.get("authorization", "")
        if auth.startswith("Bearer ") and _same(auth[7:].strip(), self.token):
            return None
        cookies = dict(c.strip().split("=", 1) for c in headers.get("cookie", "").split(";")
                       if "=" in c)
        if _same(cookies.get("token", ""), self.token):
            return None
        return 401, "this dashboard needs its token: open /?token=T once in the browser, or " \
            "send 'Authorization: Bearer T' (T: the content of the server's --token-file)", []


def _same(a: str, b: str) -> bool:
    return hmac.compare_digest(a.encode(), b.encode())
