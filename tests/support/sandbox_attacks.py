"""Attacks on PythonTool's sandbox that reach past its namespaces or its memory bound, as a policy could write them; run by
tests/components/test_sandbox.py and the fault matrix (tests/test_fault_matrix.py). Each program reports what it got.

System-call numbers are written here from the kernel's tables, not taken from the code under test."""

from __future__ import annotations

import json
import os
import platform
import socket
import subprocess
import sys
import threading
import uuid
from pathlib import Path

import pytest

from components.env import PythonTool
from tests.support.tools import attempt

SYSCALLS = {  # arch/x86/entry/syscalls/syscall_64.tbl; include/uapi/asm-generic/unistd.h
    "x86_64": {"add_key": 248, "keyctl": 250, "unshare": 272},
    "aarch64": {"add_key": 217, "keyctl": 219, "unshare": 97},
}
KEYCTL_JOIN_SESSION_KEYRING, KEYCTL_SEARCH, KEYCTL_READ, KEY_SPEC_SESSION_KEYRING = 1, 10, 11, -3


def syscalls() -> dict:
    if platform.machine() not in SYSCALLS:
        pytest.skip(f"the attacks' system-call numbers are written for {sorted(SYSCALLS)}, not {platform.machine()}")
    return SYSCALLS[platform.machine()]


def check_the_trainers_keyring_is_out_of_reach(as_user: int | None = None) -> list[str]:
    """A trainer (a fresh process, in a session keyring of its own) adds a secret to its session keyring; the program
    reads it by id, searches the keyring for it and lists /proc/keys. ``as_user``: the trainer runs as that uid (in a
    user namespace) instead of root, whose program is the host's nobody. Returns the answers (every attempt refused)."""
    calls, secret = syscalls(), f"hf_{uuid.uuid4().hex}"
    reader = (
        "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\nbuf = ctypes.create_string_buffer(256)\n"
        f"n = libc.syscall({calls['keyctl']}, {KEYCTL_READ}, KEY, buf, 256)\n"
        "print('read', n, ctypes.get_errno(), buf.raw[:max(n, 0)].decode())\n"
        f"found = libc.syscall({calls['keyctl']}, {KEYCTL_SEARCH}, {KEY_SPEC_SESSION_KEYRING}, b'user', b'hf-token', 0)\n"
        "print('search', found, ctypes.get_errno())\nprint('keys', open('/proc/keys').read().count('hf-token'))"
    )
    script = (
        "import ctypes, json, sys\nfrom components.env import PythonTool\nfrom tests.support.tools import attempt\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        f"assert libc.syscall({calls['keyctl']}, {KEYCTL_JOIN_SESSION_KEYRING}, None) > 0\n"
        f"secret = {secret!r}.encode()\n"
        f"key = libc.syscall({calls['add_key']}, b'user', b'hf-token', secret, len(secret), {KEY_SPEC_SESSION_KEYRING})\n"
        "assert key > 0, ctypes.get_errno()\n"
        f"print(json.dumps(attempt(PythonTool(timeout_s=10.0), {reader!r}.replace('KEY', str(key)))))"
    )
    prefix = [] if as_user is None else ["unshare", "--user", f"--map-user={as_user}", f"--map-group={as_user}"]
    trainer = subprocess.run(
        [*prefix, sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=Path(__file__).parents[2],
    )
    assert trainer.returncode == 0, trainer.stderr[-2000:]
    answer = json.loads(trainer.stdout.splitlines()[-1])
    assert secret not in answer, answer
    return answer.splitlines()


SHM = """
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
held = 0
for i in range(40):
    segment = libc.shmget(0, 16 << 20, 0o1600)  # IPC_PRIVATE, IPC_CREAT | 0600
    if segment < 0:
        break
    address = libc.shmat(segment, None, 0)
    ctypes.memset(address, 1, 16 << 20)
    libc.shmdt(ctypes.c_void_p(address))  # the segment outlives the mapping: the address space is free again
    held += 16
print('shm', held, 'MiB', ctypes.get_errno())
"""
MEMFD = """
import os
held, error = 0, None
try:
    for i in range(600):
        fd = os.memfd_create('x')
        os.pwrite(fd, b'x' * (1 << 20), 0)  # its pages are nowhere in the address space
        held += 1
except OSError as err:
    error = err.strerror
print('memfd', held, 'MiB', error)
"""
OTHER_IPC = """
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
print('msgget', libc.msgget(0, 0o1600), ctypes.get_errno())
print('semget', libc.semget(0, 1000, 0o1600), ctypes.get_errno())
print('mq_open', libc.mq_open(b'/q', os.O_CREAT | os.O_RDWR, 0o600, None), ctypes.get_errno())
"""
BUFFERS = """
import fcntl, os, socket
r, w = os.pipe()
try: print('pipe', fcntl.fcntl(w, 1031, 1 << 20))  # F_SETPIPE_SZ
except OSError as err: print('pipe', err.strerror)
a, b = socket.socketpair()
try: a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 24); print('sndbuf', a.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF))
except OSError as err: print('sndbuf', err.strerror)
files = []
try:
    while len(files) < 2000: files.append(os.open('/dev/null', os.O_RDONLY))
except OSError as err: print('open files refused at', max(files) + 1, err.strerror)
else: print('open files', len(files))
"""
INOTIFY = """
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
def watch(fd):
    watches = set()  # a hard link's second watch is its first one again
    for folder, _, names in os.walk('/usr'):
        for name in names:
            wd = libc.inotify_add_watch(fd, os.path.join(folder, name).encode(), 0x100)  # IN_CREATE
            if wd >= 0:
                watches.add(wd)
            elif ctypes.get_errno() == 28:  # ENOSPC: the limit on watches
                return len(watches), 'refused'
            if len(watches) == 5000:
                return len(watches), 'stopped'
fd = libc.inotify_init1(0)
print('inotify', *watch(fd)) if fd >= 0 else print('inotify_init1', fd, ctypes.get_errno())
"""
NESTED = """
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
print('unshare', libc.syscall(UNSHARE, 0x10000000 | 0x00020000 | 0x08000000), ctypes.get_errno())  # user, mount, IPC
"""
FILES = """
import time
start, made, error = time.monotonic(), 0, None
try:
    while made < 105_000:
        open(f'f{made}', 'w').close()
        made += 1
except OSError as err:
    error = err.strerror
print('files', made, error)
"""


def check_memory_outside_the_address_space_is_bounded() -> dict[str, str]:
    """With ``memory_mb: 64, max_processes: 1``: System V shared memory (16 MiB segments, detached), 600 memfds of 1 MiB,
    the other IPC objects, grown pipe and socket buffers, open files, inotify watches, a nested user namespace (whose
    own IPC namespace and mounts no limit would bound) and 105k empty files in the scratch folder. Returns the
    answers by name."""
    tool = PythonTool(timeout_s=30.0, memory_mb=64, max_processes=1)
    programs = {
        "shm": SHM,
        "memfd": MEMFD,
        "ipc": OTHER_IPC,
        "buffers": BUFFERS,
        "inotify": INOTIFY,
        "nested": NESTED.replace("UNSHARE", str(syscalls()["unshare"])),
        "files": FILES,
    }
    return {name: attempt(tool, code) for name, code in programs.items()}


def check_no_unix_socket_of_the_host_is_reachable(folder: Path, monkeypatch) -> str:
    """A stream and a datagram Unix socket the trainer binds (open to every user) in ``folder``, which the sandbox mounts
    (as it mounts a virtual environment inside the working folder); the program connects to one and sends to the other.
    Returns its answer; what the sockets received is asserted empty."""
    from components.env import sandbox

    folder.chmod(0o755)
    stream_path, datagram_path = folder / "stream.sock", folder / "datagram.sock"
    received = []
    with (
        socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as stream,
        socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as datagram,
    ):
        stream.bind(str(stream_path))
        datagram.bind(str(datagram_path))
        for path in (stream_path, datagram_path):
            os.chmod(path, 0o777)
        stream.listen()
        stream.settimeout(0.2)
        datagram.settimeout(0.2)
        done = threading.Event()

        def serve():
            while not done.is_set():
                try:
                    connection, _ = stream.accept()
                    received.append(connection.recv(64))
                    connection.close()
                except TimeoutError:
                    pass
                try:
                    received.append(datagram.recv(64))
                except TimeoutError:
                    pass

        server = threading.Thread(target=serve)
        server.start()
        bound = sandbox.mounts
        monkeypatch.setattr(
            sandbox,
            "mounts",
            lambda network: sorted([*bound(network), ("bind", str(folder))], key=lambda m: m[1].split("/")),
        )
        code = (
            "import socket\n"
            f"try:\n    s = socket.socket(socket.AF_UNIX); s.connect({str(stream_path)!r}); s.sendall(b'stream'); print('stream sent')\n"
            "except OSError as err: print('stream', err.strerror)\n"
            f"try:\n    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM); a.sendto(b'datagram', {str(datagram_path)!r}); print('datagram sent')\n"
            "except OSError as err: print('datagram', err.strerror)"
        )
        try:
            answer = attempt(PythonTool(timeout_s=5.0), code)
        finally:
            done.set()
            server.join()
    assert received == [], received
    return answer


AF_MAX = 46  # include/linux/socket.h (Linux 5.15+: AF_MCTP 45 is the last family)
AF_INET, AF_INET6 = 2, 10
SOCKET_FAMILIES = """
import errno, json, socket
def attempt(family, kind):
    try:
        socket.socket(family, kind).close()
        return 'opened'
    except OSError as err:
        return errno.errorcode.get(err.errno, str(err.errno))
print(json.dumps({family: [attempt(family, kind) for kind in (socket.SOCK_STREAM, socket.SOCK_DGRAM)] for family in range(AF_MAX)}))
"""


def check_socket_families(network: bool) -> dict[int, list[str]]:
    """Each socket family 0..AF_MAX-1 opened as a stream and a datagram socket by the sandboxed program (``network``
    on or off). Returns {family: [what the stream got, what the datagram got]}: "opened" or the error's name. The
    filter's refusal is EPERM; a family this kernel lacks would answer EAFNOSUPPORT without it."""
    answer = attempt(PythonTool(timeout_s=10.0, network=network), SOCKET_FAMILIES.replace("AF_MAX", str(AF_MAX)))
    return {int(family): outcome for family, outcome in json.loads(answer).items()}
