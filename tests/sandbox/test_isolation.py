"""Escape attempts: secrets, host files, network, writes outside scratch, persistence, killing
other processes, privileged syscalls, daemons. The bwrap backend must contain each; the process
backend is not a security boundary and runs only the cases it is meant to contain."""

import asyncio
import os
import socket
import subprocess
import threading

from tests.sandbox.conftest import NOT_A_BOUNDARY, SMALL, assert_reusable, run, skip_unless
from traingym.sandbox import Limits, SandboxError, open_sandbox


def test_environment_is_empty(backend, monkeypatch):
    monkeypatch.setenv("TRAINGYM_SECRET_TOKEN", "s3cret")

    async def body(sb):
        r = await sb.exec("import os; print(sorted(os.environ))")
        assert r.ok and b"TRAINGYM_SECRET_TOKEN" not in r.stdout, r
        r = await sb.exec(["sh", "-c", "env; cat /proc/1/environ /proc/$PPID/environ"])
        assert b"s3cret" not in r.stdout + r.stderr

    run(backend, body)


def test_host_files_and_credentials_are_invisible(backend, tmp_path):
    skip_unless(backend, ("bwrap",), NOT_A_BOUNDARY + "it sees the host filesystem")
    secret = tmp_path / "credentials"
    secret.write_text("s3cret")

    async def body(sb):
        code = f"""
import os
print(sorted(os.listdir('/')))
print(os.listdir('/root'))
for p in ['{secret}', '/etc/shadow', '/etc/passwd', '/work', '/home', '/root/.ssh',
          '/proc/1/root/work', '/sys']:
    print(p, os.path.exists(p))
"""
        r = await sb.exec(code)
        assert r.ok, r
        lines = r.stdout.decode().splitlines()
        assert "work" not in lines[0] and "home" not in lines[0]
        assert lines[1] in ("[]", "['.pyenv']")  # only the Python installation, if under /root
        assert all(line.endswith("False") for line in lines[2:]), lines
        r = await sb.exec(["cat", str(secret)])
        assert not r.ok and b"s3cret" not in r.stdout

    run(backend, body)


def test_no_network_dns_metadata_or_host_ports(backend):
    skip_unless(backend, ("bwrap",), NOT_A_BOUNDARY + "it shares the host's network")
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    server.settimeout(0.2)
    accepted = []

    def accept():
        try:
            accepted.append(server.accept())
        except TimeoutError:
            pass

    async def body(sb):
        code = f"""
import socket
for host, port in [("127.0.0.1", {port}), ("169.254.169.254", 80), ("1.1.1.1", 53)]:
    try:
        socket.create_connection((host, port), timeout=1).close()
        print("CONNECTED", host)
    except OSError as exc:
        print("refused", host, type(exc).__name__)
try:
    socket.getaddrinfo("example.com", 80)
    print("RESOLVED")
except OSError:
    print("no dns")
"""
        r = await sb.exec(code)
        assert r.ok and b"CONNECTED" not in r.stdout and b"RESOLVED" not in r.stdout, r
        r = await sb.exec(["cat", "/proc/net/dev"])
        ifaces = [line.split(":")[0].strip() for line in r.stdout.decode().splitlines()[2:]]
        assert ifaces == ["lo"], ifaces

    try:
        run(backend, body)
        thread = threading.Thread(target=accept)
        thread.start()
        thread.join()
        assert not accepted, "the sandbox reached a host port"
    finally:
        server.close()


def test_cannot_write_or_delete_outside_scratch(backend):
    skip_unless(backend, ("bwrap",), NOT_A_BOUNDARY + "it writes as the host user")
    import sys

    async def body(sb):
        targets = ["/usr/bin/env", os.path.join(sys.base_prefix, "lib"), "/etc/ld.so.cache", "/"]
        code = f"""
import os, shutil
for t in {targets!r}:
    for attempt in (lambda: open(os.path.join(t, 'x') if os.path.isdir(t) else t, 'ab'),
                    lambda: os.remove(t), lambda: shutil.rmtree(t), lambda: os.chmod(t, 0o777)):
        try:
            attempt()
            print("CHANGED", t)
        except OSError:
            pass
"""
        r = await sb.exec(code)
        assert r.ok and b"CHANGED" not in r.stdout, r
        assert os.path.exists("/usr/bin/env") and os.access(sys.base_prefix, os.R_OK)

    run(backend, body)


PERSIST = """
import ctypes, os, subprocess
open('/sandbox/left', 'w').write('x'); open('/tmp/left', 'w').write('x')
open('/dev/shm/left', 'w').write('x')
libc = ctypes.CDLL(None)
assert libc.shmget(1234, 4096, 0o1666) >= 0
subprocess.Popen(['sleep', '30'], start_new_session=True)
"""
CHECK = """
import os
print([p for p in ('/sandbox/left', '/tmp/left', '/dev/shm/left') if os.path.exists(p)])
print(open('/proc/sysvipc/shm').read().splitlines()[1:])
print(sorted(int(p) for p in os.listdir('/proc') if p.isdigit()))
"""


def test_no_state_persists_after_reset(backend):
    skip_unless(backend, ("bwrap",), NOT_A_BOUNDARY + "it shares /tmp, IPC and the pid space "
                "with the host; only its workspace is wiped")

    async def body(sb):
        assert (await sb.exec(PERSIST)).ok
        await sb.reset()
        r = await sb.exec(CHECK)
        files, shm, pids = r.stdout.decode().splitlines()
        assert files == "[]" and shm == "[]", r
        assert len(eval(pids)) == 3, pids  # init, agent, this process

    run(backend, body)


def test_workspace_is_wiped_on_reset(backend):
    async def body(sb):
        await sb.write_file("dir/a.py", b"x = 1")
        r = await sb.exec(["cat", "dir/a.py"])
        assert r.stdout == b"x = 1"  # files persist within a session ...
        await sb.reset()
        r = await sb.exec("import os; print(os.listdir('.'))")
        assert r.stdout == b"[]\n"  # ... and not after it

    run(backend, body)


DAEMON = """
import os, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        time.sleep(0.5)
        open('/tmp/daemon-was-here', 'w').write('x')
        time.sleep(30)
    os._exit(0)
print('parent done')
"""


def test_daemonized_children_die_with_the_execution(backend):
    skip_unless(backend, ("bwrap",), NOT_A_BOUNDARY + "it kills only the execution's process "
                "group; a child that calls setsid escapes it")

    async def body(sb):
        r = await sb.exec(DAEMON)
        assert r.ok and r.wall_s < 0.4, r  # returns when the parent exits, not the daemon
        await asyncio.sleep(0.7)
        r = await sb.exec("import os; print(os.path.exists('/tmp/daemon-was-here'), "
                          "len([p for p in os.listdir('/proc') if p.isdigit()]))")
        assert r.stdout == b"False 3\n", r

    run(backend, body)


def test_cannot_kill_host_or_other_sandboxes(backend):
    skip_unless(backend, ("bwrap",), NOT_A_BOUNDARY + "it can signal every process of its user")
    victim = subprocess.Popen(["sleep", "30"])

    async def main():
        a = await open_sandbox("bwrap", SMALL, scratch_bytes=1 << 24)
        b = await open_sandbox("bwrap", SMALL, scratch_bytes=1 << 24)
        try:
            r = await a.exec(f"import os\ntry:\n    os.kill({victim.pid}, 9)\nexcept OSError as e:"
                             "\n    print(type(e).__name__)")
            assert r.stdout == b"ProcessLookupError\n", r
            r = await a.exec("import os, signal; os.kill(-1, signal.SIGKILL)")
            # kill(-1) reaches the agent of its own sandbox: that sandbox breaks, and says so
            assert not r.ok and r.killed_reason == "sandbox", r
            try:
                await a.exec("print(1)")
                raise AssertionError("a broken sandbox accepted work")
            except SandboxError:
                pass
            await assert_reusable(b)
        finally:
            await a.close()
            await b.close()

    try:
        asyncio.run(main())
        assert victim.poll() is None, "the sandbox killed a host process"
    finally:
        victim.kill()
        victim.wait()


PRIVILEGED = """
import ctypes, os, subprocess
libc = ctypes.CDLL(None, use_errno=True)
results = {}
results['mount'] = libc.mount(b'none', b'/tmp', b'tmpfs', 0, None)
results['umount'] = libc.umount2(b'/proc', 2)
results['ptrace_agent'] = libc.ptrace(16, os.getppid(), None, None)  # PTRACE_ATTACH
results['unshare_user'] = libc.unshare(0x10000000)
results['unshare_mount'] = libc.unshare(0x00020000)
results['setuid'] = libc.setuid(1000) if os.getuid() != 1000 else -1
results['chroot'] = libc.chroot(b'/tmp')
results['reboot'] = libc.reboot(0x4321fedc)
results['unshare_cli'] = subprocess.run(['unshare', '-r', 'true'], capture_output=True).returncode
print(results)
"""


def test_privileged_syscalls_fail(backend):
    skip_unless(backend, ("bwrap",), NOT_A_BOUNDARY + "as root on the host these calls succeed")

    async def body(sb):
        r = await sb.exec(PRIVILEGED)
        assert r.ok, r
        results = eval(r.stdout)
        assert all(v != 0 for v in results.values()), results
        cap = await sb.exec(["grep", "CapEff", "/proc/self/status"])
        assert cap.stdout.split()[-1] == b"0000000000000000"
        await assert_reusable(sb)

    run(backend, body)


def test_limits_can_be_unset(backend):
    async def body(sb):
        limits = Limits(cpu_s=None, memory_bytes=None, file_bytes=None)
        assert (await sb.exec("print(sum(range(10**6)))", limits=limits)).ok

    run(backend, body)
