"""The SDK's protobuf encodings (tinker.proto.tinker_public_pb2): forward_backward requests in,
ForwardBackwardOutput and SampleResponse out. Every other call is JSON.

Only what the server uses is decoded: token chunks (`encoded_text`; image and audio chunks are
refused), dense 1-D tensors (sparse CSR and other ranks refused), float and text loss config.
"""

from __future__ import annotations

import numpy as np

from traingym.tinker.futures import UserError

_NP = {1: np.float32, 2: np.int64, 3: np.int32}  # DType -> numpy (bfloat16 refused)


def pb():
    from tinker.proto import tinker_public_pb2  # the `tinker` extra

    return tinker_public_pb2


def _tensor(name: str, msg) -> np.ndarray:
    dtype = _NP.get(msg.dtype)
    if dtype is None:
        raise UserError(f"loss_fn_inputs[{name!r}]: dtype {msg.dtype} is not float32 or int64")
    if msg.HasField("sparse_csr"):
        raise UserError(f"loss_fn_inputs[{name!r}]: sparse tensors are not supported; send a "
                        "dense 1-D tensor")
    if len(msg.dense) % np.dtype(dtype).itemsize:
        raise UserError(f"loss_fn_inputs[{name!r}]: {len(msg.dense)} bytes is not a whole "
                        "number of values")
    arr = np.frombuffer(msg.dense, dtype=dtype)
    shape = list(msg.shape) or [arr.size]
    if len(shape) != 1 or shape[0] != arr.size:
        raise UserError(f"loss_fn_inputs[{name!r}]: shape {shape} for {arr.size} values; only "
                        "1-D tensors (one value per input token) are supported")
    return arr


def tokens_of(chunks) -> list[int]:
    out: list[int] = []
    for c in chunks:
        kind = c.WhichOneof("chunk") if hasattr(c, "WhichOneof") else None
        if kind != "encoded_text":
            raise UserError(f"model_input chunk of type {kind!r}: only token chunks "
                            "(encoded_text) are supported")
        if len(c.encoded_text.tokens) % 4:
            raise UserError("encoded_text tokens are not whole int32 values")
        out.extend(np.frombuffer(c.encoded_text.tokens, dtype=np.int32).tolist())
    return out


def read_forward_backward(body: bytes) -> dict:
    """The request as plain data: model_id, seq_id, loss_fn, forward_only, config, and data
    [(tokens, {name: array})]."""
    msg = pb().ForwardBackwardRequest()
    try:
        msg.ParseFromString(body)
    except Exception as e:  # protobuf's DecodeError
        raise UserError(f"the body is not a ForwardBackwardRequest protobuf ({e})") from None
    config: dict = {k: float(v) for k, v in msg.loss_fn_config.items()}
    for k, v in msg.loss_fn_config_v2.items():
        config[k] = v.text if v.WhichOneof("value") == "text" else float(v.number)
    data = [(tokens_of(d.model_input), {k: _tensor(k, t) for k, t in d.loss_fn_inputs.items()})
            for d in msg.data]
    return {"model_id": msg.model_id, "seq_id": msg.seq_id, "loss_fn": msg.loss_fn,
            "forward_only": msg.forward_only, "config": config, "data": data}


def _batched(arrays: list[np.ndarray]):
    p = pb()
    dtype = p.DTYPE_FLOAT32 if arrays[0].dtype == np.float32 else p.DTYPE_INT64
    sizes = np.cumsum([0] + [a.nbytes for a in arrays]).astype(np.int64)
    return p.BatchedTensor(data=b"".join(a.tobytes() for a in arrays), offsets=sizes.tobytes(),
                           dtype=dtype)


def forward_backward_output(outputs: list[dict[str, np.ndarray]], metrics: dict) -> bytes:
    """One ArrayRecord over all datums; each field a BatchedTensor of per-datum 1-D arrays."""
    p = pb()
    record = p.ArrayRecord(type_tag="TorchLossReturn", num_datums=len(outputs))
    for name in outputs[0] if outputs else ():
        record.fields[name].CopyFrom(_batched([o[name] for o in outputs]))
    msg = p.ForwardBackwardOutput(loss_fn_output_type="TorchLossReturn",
                                  loss_fn_outputs=[record], metrics=metrics)
    return msg.SerializeToString()


def sample_response(sequences: list[tuple], prompt_logprobs: list[float] | None) -> bytes:
    """sequences: (stop_reason 'stop' | 'length', tokens, logprobs, top-k or None: per token
    [(token id, logprob)] most likely first); prompt_logprobs with NaN where none was computed
    (the first token)."""
    p = pb()
    stops = {"stop": p.STOP_REASON_STOP, "length": p.STOP_REASON_LENGTH}
    msg = p.SampleResponse()
    for reason, tokens, logprobs, top in sequences:
        seq = msg.sequences.add(stop_reason=stops[reason],
                                tokens=np.asarray(tokens, dtype=np.int32).tobytes(),
                                logprobs=np.asarray(logprobs, dtype=np.float32).tobytes())
        if top:
            k = len(top[0])
            seq.topk_sampled_logprobs.CopyFrom(p.TopkLogprobs(
                token_ids=np.asarray([[t for t, _ in row] for row in top], np.int32).tobytes(),
                logprobs=np.asarray([[lp for _, lp in row] for row in top],
                                    np.float32).tobytes(), k=k, length=len(top)))
    if prompt_logprobs is not None:
        msg.prompt_logprobs = np.asarray(prompt_logprobs, dtype=np.float32).tobytes()
    return msg.SerializeToString()
