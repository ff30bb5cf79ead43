"""The run-directory lock's decisions (runlock.py) and the SIGTERM handler's scope (preempt.py),
in one process: records from other hosts and dead or live processes are written by hand."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

from traingym.runs import lock as runlock
from traingym.runs.preempt import Preemption, resume_command


def _record(path, **fields):
    rec = {"host": socket.gethostname(), "pid": 1, "pid_start": None, "since": time.time(),
           "command": "traingym train", "heartbeat": time.time(), **fields}
    path.mkdir(parents=True, exist_ok=True)
    (path / runlock.LOCK_NAME).write_text(json.dumps(rec))


def test_held_lock_refuses_a_second_holder_naming_it_and_release_frees_it(tmp_path):
    lock = runlock.acquire(tmp_path / "r")
    rec = json.loads((tmp_path / "r" / runlock.LOCK_NAME).read_text())
    assert rec["pid"] == os.getpid() and rec["host"] == socket.gethostname()
    with pytest.raises(runlock.RunDirInUse, match=f"in use by pid {os.getpid()} on host") as e:
        runlock.acquire(tmp_path / "r")  # another open file description: flock refuses
    assert isinstance(e.value, FileExistsError)  # the CLI's one-line, exit-2 errors
    lock.release()
    lock.release()  # idempotent
    assert (tmp_path / "r" / runlock.LOCK_NAME).read_text() == ""
    runlock.acquire(tmp_path / "r").release()


def test_heartbeat_is_refreshed_while_held(tmp_path):
    lock = runlock.acquire(tmp_path / "r", heartbeat_s=0.05)
    first = lock.record["heartbeat"]
    time.sleep(0.4)
    rec = json.loads((tmp_path / "r" / runlock.LOCK_NAME).read_text())
    lock.release()
    assert rec["heartbeat"] > first


def test_other_host_with_a_fresh_heartbeat_refuses(tmp_path):
    _record(tmp_path / "r", host="node-7", pid=4242)
    with pytest.raises(runlock.RunDirInUse, match="pid 4242 on host node-7.*heartbeat is 0 s old"):
        runlock.acquire(tmp_path / "r")
    assert json.loads((tmp_path / "r" / runlock.LOCK_NAME).read_text())["host"] == "node-7"


def test_other_host_with_a_stale_heartbeat_is_taken_over_with_a_warning(tmp_path, capsys):
    _record(tmp_path / "r", host="node-7", pid=4242, heartbeat=time.time() - 60)
    lock = runlock.acquire(tmp_path / "r")
    rec = json.loads((tmp_path / "r" / runlock.LOCK_NAME).read_text())
    lock.release()
    assert rec["pid"] == os.getpid() and rec["host"] == socket.gethostname()
    err = capsys.readouterr().err
    assert "warning: taking over" in err and "pid 4242 on host node-7" in err


def test_same_host_dead_pid_is_taken_over(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    _record(tmp_path / "r", pid=dead.pid)
    runlock.acquire(tmp_path / "r").release()


def test_same_host_live_pid_refuses_when_flock_is_not_honoured(tmp_path):
    """A free flock but a record naming a live process here: a filesystem ignoring flock."""
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        _record(tmp_path / "r", pid=live.pid, pid_start=runlock._proc_start(live.pid))
        with pytest.raises(runlock.RunDirInUse, match=f"pid {live.pid}.*does not honour flock"):
            runlock.acquire(tmp_path / "r")
        _record(tmp_path / "r", pid=live.pid, pid_start="1")  # the pid reused by another process
        runlock.acquire(tmp_path / "r").release()
    finally:
        live.kill()
        live.wait()


def test_unreadable_record_without_a_holder_names_the_file(tmp_path):
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / runlock.LOCK_NAME).write_text("{garbage")
    with pytest.raises(runlock.RunDirInUse, match="unreadable record.*delete that file"):
        runlock.acquire(tmp_path / "r")


def test_preemption_handler_is_scoped_and_main_thread_only():
    before = signal.getsignal(signal.SIGTERM)
    with Preemption() as p:
        assert signal.getsignal(signal.SIGTERM) == p._handle
        os.kill(os.getpid(), signal.SIGTERM)
        for _ in range(100):  # the handler runs in the main thread between bytecodes
            if p.requested:
                break
            time.sleep(0.01)
        assert p.requested == "SIGTERM"
    assert signal.getsignal(signal.SIGTERM) == before

    seen = []

    def other_thread():
        with Preemption() as q:
            seen.append((q._installed, signal.getsignal(signal.SIGTERM)))

    t = threading.Thread(target=other_thread)
    t.start()
    t.join()
    assert seen == [(False, before)]


def test_resume_command_repeats_the_arguments():
    cmd = resume_command("my run.toml", "tiny", ["steps=9", "trainer.lr=1e-4"], "runs/a b",
                         quiet=True)
    assert cmd == ("traingym train 'my run.toml' --preset tiny --set steps=9 --set "
                   "trainer.lr=1e-4 --run-dir 'runs/a b' --resume --quiet")
    assert resume_command(None, "default", [], "runs/a") == \
        "traingym train --run-dir runs/a --resume"
