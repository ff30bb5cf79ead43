"""The FastAPI application: the Tinker REST API under /api/v1, as the `tinker` SDK 0.38 calls it.

Every route but /api/v1/healthz needs the key in `X-API-Key` (the SDK sends its api_key so);
the key check and the body-size limit run in an ASGI middleware before routing, with the
project's raw ASGI helpers (core/asgi.py): an oversized body is never held, it is answered 413
and the connection closed. JSON bodies are validated with the SDK's own pydantic request types
(so a field the SDK does not send is refused, 400); forward_backward's body is protobuf
(optionally zstd-compressed), as the SDK sends it. Refusals are 4xx JSON
{"error": {"message", "type", "code"}}; an unexpected error in a route is a 500 for that
request only; an error in queued work fails that future only.
"""


import asyncio
import hmac
import json
from contextlib import asynccontextmanager

from traingym.core.asgi import call_with_body, send_json
from traingym.tinker.errors import ApiError
from traingym.tinker.futures import UserError
from traingym.tinker.service import Service
from traingym.tinker.wire import read_forward_backward

DRAIN_BYTES, DRAIN_S = 64 << 20, 10.0
OPEN = {"/api/v1/healthz"}


class Guard:
    """ASGI middleware: X-API-Key (constant-time compare) and the body-size limit."""

    def __init__(self, app, api_key: str, max_body: int):
        self.app, self.key, self.max_body = app, api_key.encode(), max_body

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = dict(scope.get("headers") or [])
        if scope["path"] not in OPEN:
            given = headers.get(b"x-api-key", b"")
            if not hmac.compare_digest(given, self.key):
                why = "a wrong API key" if given else "no X-API-Key header"
                return await send_json(send, 401, ApiError(
                    401, f"this server needs its API key; the request had {why}",
                    "invalid_api_key").body())
        too_big = ApiError(413, f"request body over the limit of {self.max_body} bytes "
                           "(max_body_bytes)", "max_body_bytes").body()
        bad = ApiError(400, "Content-Length is not a number").body()
        return await call_with_body(self.app, scope, receive, send, headers, self.max_body,
                                    too_big, bad, DRAIN_BYTES, DRAIN_S)


def _validate(model_cls, raw: bytes):
    from pydantic import ValidationError

    try:
        data = json.loads(raw or b"{}")
    except (ValueError, RecursionError) as e:
        raise ApiError(400, f"the request body is not valid JSON ({e})", "invalid_json") from None
    if not isinstance(data, dict):
        raise ApiError(400, "the request body must be a JSON object", "invalid_json")
    if model_cls is dict:
        return data
    try:
        return model_cls.model_validate(data)
    except ValidationError as e:
        text = "; ".join(f"{'.'.join(map(str, err['loc'])) or 'body'}: {err['msg']}"
                         for err in e.errors()[:5])
        raise ApiError(400, f"invalid request: {text}", "invalid_request") from None


def _unzstd(body: bytes, limit: int) -> bytes:
    import zstandard

    try:
        with zstandard.ZstdDecompressor().stream_reader(body) as reader:
            out = reader.read(limit + 1)
    except zstandard.ZstdError as e:
        raise ApiError(400, f"Content-Encoding zstd: the body does not decompress ({e})") \
            from None
    if len(out) > limit:
        raise ApiError(413, f"decompressed body over {limit} bytes (max_body_bytes)",
                       "max_body_bytes")
    return out


def build_app(service: Service, api_key: str):
    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse, Response
    from starlette.exceptions import HTTPException
    from tinker import types as T

    @asynccontextmanager
    async def lifespan(app):
        service.futures.start(asyncio.get_running_loop())
        yield
        service.futures.stop()
        service.engines.close()

    app = FastAPI(title="traingym tinker", lifespan=lifespan, docs_url=None, redoc_url=None,
                  openapi_url=None)
    v1 = "/api/v1"

    @app.exception_handler(ApiError)
    async def _api_error(request, err: ApiError):
        return JSONResponse(err.body(), status_code=err.status)

    @app.exception_handler(HTTPException)
    async def _http_error(request, err):
        what = "no such route" if err.status_code == 404 else err.detail
        return JSONResponse(ApiError(err.status_code, f"{request.method} {request.url.path}: "
                                     f"{what}", "not_found").body(), status_code=err.status_code)

    @app.exception_handler(Exception)
    async def _crash(request, err):
        return JSONResponse(ApiError(500, f"internal error: {type(err).__name__}: {err}",
                                     "internal_error").body(), status_code=500)

    async def body(request: Request, model_cls):
        return _validate(model_cls, await request.body())

    def future(rid: str, model_id: str | None = None, **extra) -> dict:
        return {"request_id": rid, "model_id": model_id, **extra}

    @app.get(v1 + "/healthz")
    async def healthz():
        return {"status": "ok"}

    @app.get(v1 + "/get_server_capabilities")
    async def capabilities():
        return service.capabilities()

    @app.post(v1 + "/client/config")
    async def client_config(request: Request):
        await body(request, T.ClientConfigRequest)
        cfg = service.cfg  # the SDK splits forward_backward batches to fit these limits
        return {"pjwt_auth_enabled": False, "credential_default_source": "api_key",
                "proto_compress_fwdbwd": False, "sample_use_retrieve_futures": True,
                "custom_loss_server_side": False, "sample_join_sampling_session": False,
                "use_pyqwest_transport": cfg.client_pyqwest,
                "fwdbwd_max_chunk_len": min(1024, cfg.max_datums),
                "fwdbwd_max_chunk_bytes_count": min(5_000_000, cfg.max_body_bytes // 2),
                "sample_max_concurrent_requests": cfg.max_pending}

    @app.post(v1 + "/client/dynamic_config")
    async def dynamic_config(request: Request):
        await body(request, T.ClientConfigRequest)
        return {"sample_cancel_enabled": False}

    @app.post(v1 + "/telemetry")
    async def telemetry(request: Request):
        await request.body()  # accepted and dropped
        return {"status": "accepted"}

    @app.post(v1 + "/create_session")
    async def create_session(request: Request):
        return service.create_session(await body(request, T.CreateSessionRequest))

    @app.post(v1 + "/session_heartbeat")
    async def heartbeat(request: Request):
        service.session((await body(request, T.SessionHeartbeatRequest)).session_id)
        service.reap()
        return {"type": "session_heartbeat"}

    @app.post(v1 + "/sessions/{session_id}/finish")
    async def finish(session_id: str, request: Request):
        try:
            data = json.loads(await request.body() or b"{}")
        except ValueError:
            raise ApiError(400, "the request body is not valid JSON", "invalid_json") from None
        service.session(session_id)  # 404 unknown, 410 closed already
        service.finish(session_id, data.get("reason") if isinstance(data, dict) else None)

    @app.post(v1 + "/create_model")
    async def create_model(request: Request):
        req = await body(request, T.CreateModelRequest)
        return future(service.create_model(req))

    @app.post(v1 + "/get_info")
    async def get_info(request: Request):
        return service.get_info((await body(request, T.GetInfoRequest)).model_id)

    @app.post(v1 + "/forward_backward")
    async def forward_backward(request: Request):
        raw = await request.body()
        if request.headers.get("content-encoding", "").lower() == "zstd":
            raw = _unzstd(raw, service.cfg.max_body_bytes)
        elif request.headers.get("content-encoding"):
            raise ApiError(400, f"Content-Encoding {request.headers['content-encoding']!r} is "
                           "not supported (zstd is)")
        if "protobuf" not in request.headers.get("content-type", ""):
            raise ApiError(415, "forward_backward takes application/x-protobuf, as the tinker "
                           "SDK sends it", "content_type")
        try:
            req = read_forward_backward(raw)
        except UserError as e:
            raise ApiError(400, str(e), "invalid_request") from None
        return future(service.forward_backward(req), req["model_id"])

    @app.post(v1 + "/optim_step")
    async def optim_step(request: Request):
        req = await body(request, T.OptimStepRequest)
        return future(service.optim_step(req), req.model_id)

    @app.post(v1 + "/save_weights")
    async def save_weights(request: Request):
        req = await body(request, T.SaveWeightsRequest)
        return future(service.save_weights(req), req.model_id)

    @app.post(v1 + "/load_weights")
    async def load_weights(request: Request):
        req = await body(request, T.LoadWeightsRequest)
        return future(service.load_weights(req), req.model_id)

    @app.post(v1 + "/save_weights_for_sampler")
    async def save_for_sampler(request: Request):
        req = await body(request, T.SaveWeightsForSamplerRequest)
        return future(service.save_for_sampler(req), req.model_id)

    @app.post(v1 + "/create_sampling_session")
    async def create_sampling_session(request: Request):
        return service.create_sampling_session(await body(request,
                                                          T.CreateSamplingSessionRequest))

    @app.get(v1 + "/samplers/{sampler_id}")
    async def get_sampler(sampler_id: str):
        return service.sampler(sampler_id)

    @app.post(v1 + "/asample")
    async def asample(request: Request):
        return service.asample(await body(request, T.SampleRequest))

    @app.get(v1 + "/training_runs/{model_id}/checkpoints")
    async def checkpoints(model_id: str):
        return service.checkpoints(model_id)

    @app.delete(v1 + "/training_runs/{model_id}/checkpoints/{checkpoint_id:path}")
    async def delete_checkpoint(model_id: str, checkpoint_id: str):
        service.delete_checkpoint(model_id, checkpoint_id)

    @app.get(v1 + "/training_runs/{model_id}")
    async def training_run(model_id: str):
        return service.training_run(model_id)

    @app.post(v1 + "/weights_info")
    async def weights_info(request: Request):
        data = _validate(dict, await request.body())
        if not isinstance(data.get("tinker_path"), str):
            raise ApiError(400, "weights_info needs {\"tinker_path\": \"tinker://...\"}")
        return service.weights_info(data["tinker_path"])

    @app.post(v1 + "/retrieve_future")
    async def retrieve_future(request: Request):
        req = await body(request, T.FutureRetrieveRequest)
        try:
            outcome = await service.futures.wait(req.request_id, service.cfg.poll_s)
        except KeyError:
            raise ApiError(404, f"no request {req.request_id!r} (unknown, or its result was "
                           "dropped: the server keeps the last kept_results)", "not_found") \
                from None
        if outcome is None:  # 408 + try_again body: the SDK polls again at once, quietly
            return JSONResponse({"type": "try_again", "request_id": req.request_id,
                                 "queue_state": "active"}, status_code=408)
        if outcome.error is not None:
            return {"error": outcome.error, "category": outcome.category}
        if outcome.proto is not None:
            return Response(outcome.proto, media_type="application/x-protobuf")
        return outcome.json

    @app.post(v1 + "/retrieve_futures")
    async def retrieve_futures(request: Request):
        req = await body(request, T.FuturesRetrieveRequest)
        target, timeout = service.retrieve_futures(req)
        try:
            done, cursor = await service.futures.completions(
                target, req.prev_cursor, timeout, req.retrieved_request_ids)
        except KeyError:
            raise ApiError(404, f"no sample was sent to sampling session {target[0]!r} as "
                           f"clone {target[1]}", "not_found") from None
        return {"cursor": cursor, "completions": [
            {"state": "failed" if out.error is not None else "finished", "request_id": rid}
            for rid, out in done]}

    return app
