"""The agent: a small stdlib-only server that runs inside a sandbox and executes jobs.

Started once per sandbox (`python -I -B -c <source>`) and driven over stdin/stdout with
length-prefixed frames (sandbox/client.py is the host side). Python code runs in a fork of the
agent's pristine state, so an execution costs a fork, not an interpreter start. After each
execution every leftover process is killed (kill(-1) in a private pid namespace, else the
child's process group); `reset` also wipes writable folders and System V IPC objects.
Covered: wall-clock deadline, output cap, rlimits, file I/O in the sandbox's own view.
Not covered here: isolation itself; that is the backend's job.
"""

import ctypes
import io
import json
import os
import resource
import select
import shutil
import signal
import struct
import sys
import time
import traceback
import types

WAKE = [None, None]  # self-pipe written on SIGCHLD, so select() wakes when the child exits
HEADER = struct.Struct("!II")  # JSON header length, number of blobs
BLOB = struct.Struct("!Q")
MAX_HEADER = 1 << 20


def read_exact(fd, n):
    chunks = []
    while n:
        chunk = os.read(fd, min(n, 1 << 20))
        if not chunk:
            raise EOFError("control channel closed")
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def read_msg(fd):
    n_header, n_blobs = HEADER.unpack(read_exact(fd, HEADER.size))
    if n_header > MAX_HEADER:
        raise ValueError("header too large")
    header = json.loads(read_exact(fd, n_header))
    blobs = []
    for _ in range(n_blobs):
        (size,) = BLOB.unpack(read_exact(fd, BLOB.size))
        blobs.append(read_exact(fd, size))
    return header, blobs


def write_msg(fd, header, blobs=()):
    body = json.dumps(header).encode()
    parts = [HEADER.pack(len(body), len(blobs)), body]
    for blob in blobs:
        parts += [BLOB.pack(len(blob)), blob]
    data = memoryview(b"".join(parts))
    while data:
        data = data[os.write(fd, data) :]


def safe_path(workspace, rel):
    """A path inside the workspace; absolute paths and '..' components are refused."""
    if not rel or rel.startswith("/") or ".." in rel.split("/"):
        raise ValueError(f"path must be relative and stay inside the workspace: {rel!r}")
    return os.path.join(workspace, rel)


def set_limits(limits):
    pairs = [
        (resource.RLIMIT_CORE, 0),
        (resource.RLIMIT_CPU, limits.get("cpu_s")),
        (resource.RLIMIT_AS, limits.get("address_space_bytes")),
        (resource.RLIMIT_FSIZE, limits.get("file_bytes")),
        (resource.RLIMIT_NPROC, limits.get("nproc")),
    ]
    for which, value in pairs:
        if value is None:
            continue
        value = int(value)
        hard = value + 1 if which == resource.RLIMIT_CPU else value
        resource.setrlimit(which, (value, hard))


def run_python(code):
    """In the forked child: run `code` as __main__ like `python -c`, then exit."""
    sys.stdin = io.TextIOWrapper(io.FileIO(0, "r", closefd=False))
    sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), write_through=False)
    sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), line_buffering=True)
    main = types.ModuleType("__main__")
    main.__builtins__ = __builtins__
    sys.modules["__main__"] = main
    sys.argv = ["-c"]
    sys.path.insert(0, "")
    status = 0
    try:
        exec(compile(code, "<string>", "exec"), main.__dict__)
    except SystemExit as exc:
        code_ = exc.code
        if code_ is None:
            status = 0
        elif isinstance(code_, int):
            status = code_ & 0xFF
        else:
            print(code_, file=sys.stderr)
            status = 1
    except BaseException:
        traceback.print_exc()
        status = 1
    import atexit

    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass  # a closed or broken stdout at exit is the candidate's problem, not ours
    os._exit(status)


def child(req, fds, workspace, err_w):
    stdin_r, stdout_w, stderr_w = fds
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    os.setsid()
    os.dup2(stdin_r, 0)
    os.dup2(stdout_w, 1)
    os.dup2(stderr_w, 2)
    os.closerange(3, err_w)
    os.closerange(err_w + 1, 65536)
    for sig in (signal.SIGPIPE, signal.SIGXFSZ, signal.SIGXCPU, signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_DFL)
    os.chdir(workspace)
    set_limits(req["limits"])
    if req.get("code") is not None:
        os.close(err_w)
        signal.signal(signal.SIGPIPE, signal.SIG_IGN)  # as the python interpreter does
        signal.signal(signal.SIGINT, signal.default_int_handler)
        run_python(req["code"])
    argv = req["argv"]
    try:
        os.execvpe(argv[0], argv, os.environ)
    except OSError as exc:
        os.write(err_w, f"{exc.errno}".encode())
    os._exit(127)


def kill_leftovers(pid, pidns):
    if pidns:
        try:
            os.kill(-1, signal.SIGKILL)  # every process of the namespace but init and the agent
        except ProcessLookupError:
            pass  # nothing left to kill
    else:
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass  # the group is already gone
    while True:  # reap our own children (orphans are reaped by the namespace's init)
        try:
            if os.waitpid(-1, os.WNOHANG) == (0, 0):
                break
        except ChildProcessError:
            break


def run_exec(req, blobs, workspace, pidns):
    stdin = blobs[0]
    for (rel, _), data in zip(req["files"], blobs[1:]):
        path = safe_path(workspace, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(data)
    stdin_r, stdin_w = os.pipe()
    stdout_r, stdout_w = os.pipe()
    stderr_r, stderr_w = os.pipe()
    err_r, err_w = os.pipe2(os.O_CLOEXEC)
    start = time.monotonic()
    pid = os.fork()
    if pid == 0:
        try:
            child(req, (stdin_r, stdout_w, stderr_w), workspace, err_w)
        finally:
            os._exit(127)
    for fd in (stdin_r, stdout_w, stderr_w, err_w):
        os.close(fd)
    result = pump(pid, req, stdin, stdin_w, {stdout_r: "stdout", stderr_r: "stderr"}, start)
    exec_errno = os.read(err_r, 64)
    os.close(err_r)
    kill_leftovers(pid, pidns)
    if exec_errno:
        result["exec_error"] = os.strerror(int(exec_errno))
    return result


def pump(pid, req, stdin, stdin_w, outs, start):
    """Feed stdin, collect output up to the cap, enforce the deadline, wait for the child.

    Once the child has exited, output already in the pipes is collected and the execution
    ends, even if a descendant still holds the pipes open (it is killed afterwards)."""
    cap = req["limits"]["output_bytes"]
    deadline = start + req["limits"]["wall_s"]
    data = {name: [] for name in outs.values()}
    total, killed, status, rusage = 0, None, None, None
    os.set_blocking(stdin_w, False)
    pending = memoryview(stdin)
    if not pending:
        os.close(stdin_w)
        stdin_w = None
    open_fds = dict(outs)
    while killed is None:
        if status is None:
            wpid, st, ru = os.wait4(pid, os.WNOHANG)
            if wpid:
                status, rusage = st, ru
        left = deadline - time.monotonic()
        if status is None and left <= 0:
            killed = "wall"
            break
        if status is not None:
            if stdin_w is not None:
                os.close(stdin_w)
                stdin_w = None
            left = 0
        writers = [stdin_w] if stdin_w is not None else []
        readable, writable, _ = select.select([*open_fds, WAKE[0]], writers, [], max(left, 0))
        if WAKE[0] in readable:
            readable.remove(WAKE[0])
            os.read(WAKE[0], 4096)
        elif status is not None and not readable:
            break  # child gone and nothing more to read right now
        if writable:
            try:
                pending = pending[os.write(stdin_w, pending[: 1 << 16]) :]
            except BrokenPipeError:
                pending = pending[:0]
            if not pending:
                os.close(stdin_w)
                stdin_w = None
        for fd in readable:
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                os.close(fd)
                del open_fds[fd]
                continue
            room = cap - total
            data[open_fds[fd]].append(chunk[: max(room, 0)])
            total += len(chunk)
            if total > cap:
                killed = "output"
        if status is not None and not open_fds:
            break
    for fd in open_fds:
        os.close(fd)
    if stdin_w is not None:
        os.close(stdin_w)
    if status is None:
        os.killpg(pid, signal.SIGKILL)
        _, status, rusage = os.wait4(pid, 0)
    wall = time.monotonic() - start
    cpu = rusage.ru_utime + rusage.ru_stime
    sig = os.WTERMSIG(status) if os.WIFSIGNALED(status) else None
    cpu_limit = req["limits"].get("cpu_s")
    if killed is None and cpu_limit is not None and sig in (signal.SIGXCPU, signal.SIGKILL):
        if sig == signal.SIGXCPU or cpu >= cpu_limit:
            killed = "cpu"
    return {
        "exit_code": os.WEXITSTATUS(status) if os.WIFEXITED(status) else None,
        "signal": sig,
        "killed_reason": killed,
        "truncated": total > cap,
        "wall_s": wall,
        "cpu_s": cpu,
        "max_rss_bytes": rusage.ru_maxrss * 1024,
        "_out": [b"".join(data["stdout"]), b"".join(data["stderr"])],
    }


def wipe(dirs):
    for d in dirs:
        for name in os.listdir(d):
            path = os.path.join(d, name)
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path)
            else:
                os.unlink(path)


def remove_sysv_ipc():
    """Remove System V shared memory, semaphores and message queues left in the namespace."""
    libc = ctypes.CDLL(None, use_errno=True)
    ipc_rmid = 0
    for table, fn in (("shm", libc.shmctl), ("sem", libc.semctl), ("msg", libc.msgctl)):
        with open(f"/proc/sysvipc/{table}") as f:
            rows = f.read().splitlines()[1:]
        for row in rows:
            ident = int(row.split()[1])
            if table == "sem":
                fn(ident, 0, ipc_rmid)
            else:
                fn(ident, ipc_rmid, None)


def serve(workspace, wipe_dirs, pidns):
    ctrl_in, ctrl_out = os.dup(0), os.dup(1)
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1):
        os.dup2(devnull, fd)
    os.close(devnull)
    WAKE[:] = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.set_wakeup_fd(WAKE[1])
    signal.signal(signal.SIGCHLD, lambda signum, frame: None)
    ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE 0: children cannot ptrace us
    write_msg(ctrl_out, {"ok": True, "op": "ready", "pid": os.getpid()})
    while True:
        try:
            req, blobs = read_msg(ctrl_in)
        except EOFError:
            return
        op = req["op"]
        try:
            if op == "exec":
                result = run_exec(req, blobs, workspace, pidns)
                out = result.pop("_out")
                write_msg(ctrl_out, {"ok": True, **result}, out)
            elif op == "write":
                path = safe_path(workspace, req["path"])
                os.makedirs(os.path.dirname(path), exist_ok=True)
                with open(path, "wb") as f:
                    f.write(blobs[0])
                write_msg(ctrl_out, {"ok": True})
            elif op == "read":
                with open(safe_path(workspace, req["path"]), "rb") as f:
                    data = f.read(req["max_bytes"] + 1)
                if len(data) > req["max_bytes"]:
                    raise ValueError(f"{req['path']} is larger than {req['max_bytes']} bytes")
                write_msg(ctrl_out, {"ok": True}, [data])
            elif op == "reset":
                if pidns:
                    kill_leftovers(0, pidns)
                wipe(wipe_dirs)
                if pidns:
                    remove_sysv_ipc()
                write_msg(ctrl_out, {"ok": True})
            else:
                raise ValueError(f"unknown op {op!r}")
        except (OSError, ValueError) as exc:
            write_msg(ctrl_out, {"ok": False, "error": f"{type(exc).__name__}: {exc}"})


def main(argv):
    """argv: workspace, then --pidns or --no-pidns, then the directories `reset` wipes."""
    workspace, mode, *wipe_dirs = argv
    if mode not in ("--pidns", "--no-pidns"):
        raise SystemExit(f"agent: bad mode {mode!r}")
    pidns = mode == "--pidns"
    if pidns and os.getpid() > 3:
        raise SystemExit("agent: --pidns given but not running in a private pid namespace")
    serve(workspace, wipe_dirs, pidns)


if __name__ == "__main__":
    main(sys.argv[1:])
