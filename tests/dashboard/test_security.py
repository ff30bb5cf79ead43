"""The dashboard's security defaults (docs/dashboard.md, "Security"), each tested against a
running `traingym dashboard` (a subprocess on a free port, raw HTTP requests): loopback bind
by default; another interface only with a token; the Host allow-list; no CORS; read-only
methods; ids not paths (traversal strings and symlinks out of RUNS_DIR refused); security
headers on every answer; no environment variables or secrets in any answer; a `<script>`
sample comes back as JSON only; SIGTERM stops it with exit code 0."""

import json
import socket

import pytest
from dashboard_runs import Server, ThreadServer, make_eval, make_run, sample, write_jsonl
from prereq import require

require("fastapi", "the dashboard tests need fastapi (pip install 'traingym[dashboard]')")
require("uvicorn", "the dashboard tests need uvicorn (pip install 'traingym[dashboard]')")

ENV_MARKER = "envmarker-7f3c1d9a"  # an environment variable's value no answer may hold
CFG_SECRET = "cfgsecret-51be02"  # a config value under a secret-naming key
OUTSIDE = "outside-marker-c0ffee"  # content of files outside RUNS_DIR
SCRIPT = "<script>alert(1)</script>"
TOKEN = "tok-" + "a1b2c3d4" * 4


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """RUNS_DIR with a run (a `<script>` sample, secrets in its config, a samples.jsonl
    symlinked out of RUNS_DIR in a second run), an eval folder, a run folder that is a
    symlink to a run outside, and files outside RUNS_DIR holding OUTSIDE."""
    base = tmp_path_factory.mktemp("dash")
    runs, outside = base / "runs", base / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text(OUTSIDE)
    write_jsonl(outside / "samples.jsonl", [sample(0, 0, completion=OUTSIDE)])
    make_run(outside, "elsewhere", steps=2, note=OUTSIDE)
    run = make_run(runs, "r1", steps=3, finished=True,
                   sinks={"api_key": CFG_SECRET, "password": CFG_SECRET, "url": "http://x"})
    write_jsonl(run / "samples.jsonl", [sample(3, 0, completion=SCRIPT, sid="xss")], "a")
    leaky = make_run(runs, "r2", steps=1)
    (leaky / "samples.jsonl").unlink()
    (leaky / "samples.jsonl").symlink_to(outside / "samples.jsonl")
    (leaky / "trace.json").symlink_to(outside / "secret.txt")
    (runs / "linked").symlink_to(outside / "elsewhere")
    make_eval(runs, "ev1")
    return runs


@pytest.fixture(scope="module")
def server(world, tmp_path_factory):
    log = tmp_path_factory.mktemp("log") / "dashboard.log"
    s = Server(world, env={"DASHBOARD_TEST_MARKER": ENV_MARKER}, log=log)
    yield s
    s.stop()


def _other_address() -> str | None:
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("10.255.255.255", 1))  # no packet is sent
            addr = s.getsockname()[0]
    except OSError:
        return None
    return None if addr.startswith("127.") or addr == "0.0.0.0" else addr


def test_binds_loopback_by_default(server):
    assert f"http://127.0.0.1:{server.port}/" in server.log.read_text()
    other = _other_address()
    if other is not None:  # the port is closed on the machine's other interface
        with pytest.raises(OSError):
            socket.create_connection((other, server.port), timeout=5).close()


def test_other_interface_needs_a_token(world, tmp_path, capsys):
    from traingym.cli import main

    short = tmp_path / "short.txt"
    short.write_text("abc\n")
    cases = [(["--host", "0.0.0.0"], "needs a token: put one in a file and pass --token-file"),
             (["--host", "0.0.0.0", "--token-file", str(short)], "at least 16"),
             (["--host", "0.0.0.0", "--token-file", str(tmp_path / "none")], "cannot read"),
             (["--host", "192.0.2.1"], "--token-file"), (["--port", "0"], "--port 0")]
    for args, why in cases:
        assert main(["dashboard", str(world), *args]) == 2
        assert why in capsys.readouterr().err, args
    assert main(["dashboard", str(tmp_path / "no-such-runs")]) == 2
    assert "not a folder" in capsys.readouterr().err


def test_token_required_when_set(world):
    s = ThreadServer(world, token=TOKEN, host="0.0.0.0")  # as --host 0.0.0.0 --token-file F
    try:
        for path in ("/api/runs", "/", "/static/app.js", "/api/runs/r1/samples"):
            assert s.get(path)[0] == 401, path
        assert s.get("/api/runs", {"Authorization": "Bearer wrong-token-0000000000"})[0] == 401
        assert s.get("/api/runs", {"Cookie": "token=wrong"})[0] == 401
        assert s.get("/api/runs?token=" + TOKEN)[0] == 401  # the API takes no token in its URL
        assert s.get("/api/runs", {"Authorization": f"Bearer {TOKEN}"})[0] == 200
        status, headers, _ = s.get(f"/run/r1?token={TOKEN}&x=1")
        assert status == 303 and headers["location"] == "/run/r1?x=1"  # token off the URL
        cookie = headers["set-cookie"]
        assert cookie.startswith(f"token={TOKEN}") and "HttpOnly" in cookie \
            and "SameSite=Strict" in cookie
        assert s.get("/api/runs", {"Cookie": f"theme=dark; token={TOKEN}"})[0] == 200
        assert s.get("/?token=wrong")[0] == 401
    finally:
        s.stop()


def test_host_header_allow_list(server):
    assert server.get("/api/runs", host="evil.example")[0] == 400
    assert server.get("/api/runs", host=f"evil.example:{server.port}")[0] == 400
    assert server.get("/", host="127.0.0.1.evil.example")[0] == 400
    assert server.get("/api/runs", host="")[0] == 400
    for ok in (f"localhost:{server.port}", f"127.0.0.1:{server.port}", f"[::1]:{server.port}",
               "localhost"):
        assert server.get("/api/runs", host=ok)[0] == 200, ok


def test_no_cors(server):
    for method in ("GET", "OPTIONS"):
        status, headers, _ = server.request(method, "/api/runs", {
            "Origin": "http://evil.example", "Access-Control-Request-Method": "GET"})
        assert not [h for h in headers if h.startswith("access-control-")], headers
    assert server.get("/api/runs", {"Origin": "http://evil.example"})[0] == 200


def test_read_only(server):
    for method in ("POST", "PUT", "DELETE", "PATCH", "OPTIONS", "TRACE"):
        for path in ("/api/runs", "/api/runs/r1", "/", "/static/app.js", "/nowhere"):
            status, headers, _ = server.request(method, path, {"Content-Length": "0"})
            assert status == 405, (method, path, status)
            assert headers["allow"] == "GET, HEAD"
    status, _, body = server.request("HEAD", "/api/runs")
    assert status == 200 and body == b""


TRAVERSALS = [
    "/static/../../../../etc/passwd", "/static/..%2f..%2f..%2fetc%2fpasswd",
    "/static/%2e%2e/%2e%2e/etc/passwd", "/static/%2E%2E%2F%2E%2E%2Fetc%2Fpasswd",
    "/static/..\\..\\etc\\passwd", "/static/%5c..%5c..%5cetc%5cpasswd", "/static//etc/passwd",
    "//etc/passwd", "/static/%2fetc%2fpasswd", "/api/runs/..", "/api/runs/%2e%2e",
    "/api/runs/..%2foutside", "/api/runs/r1/..%2f..%2foutside%2fsecret.txt",
    "/api/runs/r1/samples/..%2f..%2f..%2foutside%2fsecret.txt",
    "/api/runs/%2Ftmp", "/api/runs/r1%00", "/api/evals/..%5c..", "/run/..%2f..%2fetc",
    "/static/%252e%252e/%252e%252e/etc/passwd", "/static/C:%5cWindows%5cwin.ini",
    "/api/runs/r1/samples/%2e%2e%2f%2e%2e%2foutside%2fsamples.jsonl",
]


@pytest.mark.parametrize("path", TRAVERSALS)
def test_traversal_refused(server, path):
    status, headers, body = server.get(path)
    assert status in (400, 404), (path, status, body[:200])
    assert OUTSIDE.encode() not in body and b"root:" not in body
    assert headers["content-type"] == "application/json"


def test_symlinks_out_of_runs_dir_not_listed_or_read(server):
    runs = json.loads(server.get("/api/runs")[2])["runs"]
    assert sorted(r["id"] for r in runs) == ["r1", "r2"]  # not "linked"
    assert server.get("/api/runs/linked")[0] == 404
    assert server.get("/api/runs/linked/events")[0] == 404
    for path in ("/api/runs/r2/samples", "/api/runs/r2/samples/L0", "/api/runs/r2/trace"):
        status, _, body = server.get(path)
        assert status in (403, 404), (path, status)
        assert OUTSIDE.encode() not in body


def test_security_headers_on_every_answer(server):
    for path in ("/", "/api/runs", "/api/runs/r1", "/static/index.html", "/api/runs/nope",
                 "/no/such/page", "/static/..%2fx"):
        status, h, _ = server.get(path)
        assert h["x-content-type-options"] == "nosniff", path
        assert h["x-frame-options"] == "DENY", path
        csp = h["content-security-policy"]
        assert "default-src 'self'" in csp and "script-src 'self'" in csp, path
        script_src = next(p for p in csp.split(";") if p.strip().startswith("script-src"))
        assert "unsafe-inline" not in script_src and "unsafe-eval" not in script_src
        assert "frame-ancestors 'none'" in csp
        assert "server" not in h
    status, h, _ = server.request("POST", "/api/runs")
    assert status == 405 and h["x-frame-options"] == "DENY"
    assert server.get("/api/runs", host="evil.example")[1]["x-content-type-options"] == "nosniff"


def test_no_environment_or_secrets_in_any_answer(server):
    paths = ["/", "/compare?runs=r1", "/run/r1", "/api/runs", "/api/runs/r1", "/api/runs/r2",
             "/api/runs/r1/events", "/api/runs/r1/series?keys=reward_mean,loss",
             "/api/runs/r1/samples?limit=500", "/api/runs/r1/samples/xss", "/api/runs/r1/trace",
             "/api/compare?runs=r1,r2&keys=loss", "/api/evals", "/api/evals/ev1",
             "/api/evals/ev1/samples", "/api/nope", "/api/runs/r1/samples/nope",
             "/api/runs/r1/series?keys=%3Cbad%3E"]
    paths += [f"/static/{name}" for name in ("index.html", "app.js", "api.js")]
    seen = b""
    for path in paths:
        status, _, body = server.get(path)
        assert ENV_MARKER.encode() not in body, path
        assert CFG_SECRET.encode() not in body, path
        assert b"sk-in-eval-summary" not in body, path
        seen += body
    detail = json.loads(server.get("/api/runs/r1")[2])
    assert detail["config"]["sinks"] == {"api_key": "***", "password": "***", "url": "http://x"}
    assert b"r1" in seen  # the answers were real ones


def test_script_sample_comes_back_as_json_only(server):
    for path in ("/api/runs/r1/samples/xss", "/api/runs/r1/samples?q=alert"):
        status, headers, body = server.get(path)
        assert status == 200 and headers["content-type"] == "application/json"
        assert b"<script>" not in body  # escaped as \u003c even inside the JSON string
    assert json.loads(server.get("/api/runs/r1/samples/xss")[2])["completion"] == SCRIPT
    items = json.loads(server.get("/api/runs/r1/samples?q=alert")[2])["items"]
    assert [i["completion"] for i in items] == [SCRIPT]


def test_sigterm_exits_zero(server):  # last: it stops the module's server
    assert server.stop() == 0
    assert "traingym dashboard: stopped" in server.log.read_text()
