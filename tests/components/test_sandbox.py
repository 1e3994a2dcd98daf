"""Model-written code cannot reach the trainer: each test is an attack a policy could write, run through the default
`PythonTool` (isolated by the kernel: components.env.sandbox), and each must fail."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

from components.env import PythonTool
from tests.support.sandbox_attacks import (
    AF_INET,
    AF_INET6,
    check_memory_outside_the_address_space_is_bounded,
    check_no_unix_socket_of_the_host_is_reachable,
    check_socket_families,
    check_the_trainers_keyring_is_out_of_reach,
)
from tests.support.tools import (
    attempt,
    check_no_file_outside_the_scratch_folder_is_read_or_written,
    check_process_count_is_bounded,
    check_without_namespaces_the_tool_refuses_unless_opted_out,
)


def as_trainer(programs: list[str], **env: str) -> list[str]:
    """Run ``programs`` through a PythonTool in a fresh process standing in for the trainer (started with ``env`` added,
    so the secrets are in its /proc/<pid>/environ) and return the answers, or fail if that process died."""
    script = (
        "import json, sys\nfrom components.env import PythonTool\nfrom tests.support.tools import attempt\n"
        "tool = PythonTool(timeout_s=5.0)\nanswers = [attempt(tool, code) for code in json.load(sys.stdin)]\nprint(json.dumps(answers))"
    )
    trainer = subprocess.run(
        [sys.executable, "-c", script],
        input=json.dumps(programs),
        capture_output=True,
        text=True,
        timeout=120,
        cwd=Path(__file__).parents[2],
        env={**os.environ, **env},
    )
    assert trainer.returncode == 0, f"the trainer died (exit {trainer.returncode}): {trainer.stderr[-2000:]}"
    return json.loads(trainer.stdout.splitlines()[-1])


def test_the_trainers_secrets_are_out_of_reach():
    secret = f"hf_{uuid.uuid4().hex}"
    environ = (  # the parent's environment (the trainer's, unsandboxed), then every process's it can see
        "import os\nfor p in [os.getppid(), *os.listdir('/proc')]:\n    try: data = open(f'/proc/{p}/environ', 'rb').read()\n"
        "    except OSError: continue\n    if b'HF_TOKEN=' in data: print(data[data.index(b'HF_TOKEN='):][:60])"
    )
    memory = (  # the first readable mapping of the parent process
        "import os\npid = os.getppid()\nfor line in open(f'/proc/{pid}/maps'):\n    if line.split()[1].startswith('r'):\n"
        "        with open(f'/proc/{pid}/mem', 'rb') as mem:\n            mem.seek(int(line.split('-')[0], 16)); print('READ', len(mem.read(64)))\n"
        "        break"
    )
    answers = as_trainer([environ, memory], HF_TOKEN=secret)
    assert secret not in answers[0] and "READ" not in answers[1], answers


def test_the_trainer_survives_a_kill():
    answers = as_trainer(["import os; os.kill(os.getppid(), 9)", "import os; os.kill(os.getppid(), 19)"])
    assert len(answers) == 2


def test_no_file_outside_the_scratch_folder_is_read_or_written(tmp_path, monkeypatch):
    check_no_file_outside_the_scratch_folder_is_read_or_written(tmp_path, monkeypatch)


@pytest.mark.server
def test_no_network(tmp_path):
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.2)
    port = server.getsockname()[1]
    accepted = []

    def accept():
        deadline = time.monotonic() + 4.0
        while time.monotonic() < deadline:
            try:
                accepted.append(server.accept()[0])
            except TimeoutError:
                pass

    waiter = threading.Thread(target=accept)
    waiter.start()
    tool = PythonTool(timeout_s=3.0)
    answer = attempt(
        tool,
        f"import socket; s = socket.create_connection(('127.0.0.1', {port}), timeout=2); s.sendall(b'POST /update_weights_from_disk'); print('SENT')",
    )
    waiter.join()
    server.close()
    assert "SENT" not in answer and accepted == []
    # a server the program opens is reachable from nowhere outside it
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        free = probe.getsockname()[1]
    listening = f"import socket, time; s = socket.create_server(('0.0.0.0', {free})); s.settimeout(2.5)\ntry: s.accept(); print('ACCEPTED')\nexcept OSError: pass"
    answers = []
    runner = threading.Thread(target=lambda: answers.append(attempt(tool, listening)))
    runner.start()
    connected = False
    deadline = time.monotonic() + 2.0
    while time.monotonic() < deadline and not connected:
        try:
            socket.create_connection(("127.0.0.1", free), timeout=0.2).close()
            connected = True
        except OSError:
            time.sleep(0.05)
    runner.join()
    assert not connected and "ACCEPTED" not in answers[0]


def _processes_with(marker: str) -> list[int]:
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if marker.encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                found.append(int(pid))
        except OSError:
            pass
    return found


@pytest.mark.slow
def test_no_process_outlives_the_timeout(tmp_path):
    marker, late = f"survivor-{uuid.uuid4().hex}", tmp_path / "written-after-the-timeout"
    code = (
        f"import os, time  # {marker}\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n        time.sleep(6.0)\n"
        f"        open({str(late)!r}, 'w').write('x')\n        os._exit(0)\n    os._exit(0)\ntime.sleep(60)"
    )
    start = time.monotonic()
    assert attempt(PythonTool(timeout_s=1.0), code) == "error: timed out after 1.0 s"
    assert time.monotonic() - start < 3.0
    assert _processes_with(marker) == []
    time.sleep(6.0)  # past the moment the survivor would write
    assert not late.exists()


def test_process_count_is_bounded():
    check_process_count_is_bounded()


def test_bytes_written_are_bounded(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    tool = PythonTool(timeout_s=10.0)
    filler = "n = 0\nfor i in range(128):\n    with open(f'fill{i}', 'wb') as f: f.write(b'x' * (1 << 20))\n    n += 1\nprint('wrote', n, 'MiB')"
    answer = attempt(tool, filler)
    assert "No space left on device" in answer, answer
    assert list(tmp_path.iterdir()) == []


def test_what_the_program_sees(monkeypatch):
    """Its own two processes, no capabilities, a read-only root, /tmp as its working folder; the trainer's home and working
    folder hidden even where they lie under a mounted path (here two folders of the mounted standard library)."""
    stdlib = os.path.dirname(os.__file__)
    home, work = os.path.join(stdlib, "json"), os.path.join(stdlib, "email")
    monkeypatch.setenv("HOME", home)
    monkeypatch.chdir(work)
    code = (
        "import os\nstatus = dict(line.split(':\\t') for line in open('/proc/self/status').read().splitlines() if ':\\t' in line)\n"
        f"print(sorted(p for p in os.listdir('/proc') if p.isdigit()), status['CapEff'], os.getcwd(), os.listdir({home!r}), os.listdir({work!r}))\n"
        "for folder in ('/', '/usr', '/etc', '/dev', '/tmp'):\n"
        "    try: open(os.path.join(folder, 'w'), 'w').close(); print(folder, 'writable')\n    except OSError as err: print(folder, err.strerror)"
    )
    assert PythonTool()(code).splitlines() == [
        "['1', '2'] 0000000000000000 /tmp [] []",
        "/ Read-only file system",
        "/usr Read-only file system",
        "/etc Read-only file system",
        "/dev Read-only file system",
        "/tmp writable",
    ]


def test_an_interpreter_under_tmp_is_mounted_inside_the_scratch_folder(tmp_path, monkeypatch):
    """A virtualenv under /tmp (a CI clone there) is bound read-only inside the program's scratch /tmp, not hidden by
    it (the scratch used to be mounted last, and its folder then already existed: the sandbox failed to start)."""
    from components.env import sandbox

    (tmp_path / "lib.txt").write_text("from the interpreter's folder")
    tmp_path.chmod(0o755)  # as a virtualenv's folders are (pytest makes its own 0700)
    assert str(tmp_path).startswith("/tmp/")
    bound = sandbox.mounts
    monkeypatch.setattr(
        sandbox,
        "mounts",
        lambda network: sorted([*bound(network), ("bind", str(tmp_path))], key=lambda m: m[1].split("/")),
    )
    code = (
        f"print(open({str(tmp_path / 'lib.txt')!r}).read())\n"
        f"try: open({str(tmp_path / 'w')!r}, 'w')\nexcept OSError as err: print(err.strerror)\n"
        "open('/tmp/scratch', 'w').write('ok'); print(open('/tmp/scratch').read())"
    )
    assert PythonTool()(code).splitlines() == ["from the interpreter's folder", "Read-only file system", "ok"]


@pytest.mark.server
def test_the_network_is_opt_in():
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        assert (
            PythonTool(network=True)(
                f"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=2); print('connected')"
            )
            == "connected"
        )


def test_without_namespaces_the_tool_refuses_unless_opted_out():
    """A trainer in a user namespace that may create none (user.max_user_namespaces = 0, as a locked-down container)."""
    check_without_namespaces_the_tool_refuses_unless_opted_out()


def test_close_ends_a_program_under_way():
    tool = PythonTool(timeout_s=30.0)
    threading.Timer(1.0, tool.close).start()
    start = time.monotonic()
    assert attempt(tool, "import time; time.sleep(30)").startswith("error:")
    assert time.monotonic() - start < 5.0


def test_a_trainer_that_is_not_root():
    """The trainer as uid 1000 (in a user namespace): the program is mapped to it, alone in its namespaces, with no capabilities."""
    script = (
        'from components.env import PythonTool\nprint(PythonTool()(\'import os; print(open("/proc/self/uid_map").read().split(), '
        'sorted(p for p in os.listdir("/proc") if p.isdigit()), open("/proc/self/status").read().split("CapEff:")[1].split()[0])\'))'
    )
    run = subprocess.run(
        ["unshare", "--user", "--map-user=1000", "--map-group=1000", sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=Path(__file__).parents[2],
    )
    assert run.stdout.strip() == "['0', '1000', '1'] ['1', '2'] 0000000000000000", run.stderr[-2000:]


def test_the_trainers_keyring_is_out_of_reach():
    """A secret in the trainer's session keyring: read by its id, searched for, listed in /proc/keys (the keyring calls
    are refused, /proc/keys is empty), from a root trainer's program (the host's nobody) and a uid-1000 trainer's."""
    refused = ["read -1 1 ", "search -1 1", "keys 0"]  # EPERM
    assert check_the_trainers_keyring_is_out_of_reach() == refused
    assert check_the_trainers_keyring_is_out_of_reach(as_user=1000) == refused


def test_memory_outside_the_address_space_is_bounded():
    """What a program with memory_mb: 64, max_processes: 1 could hold beyond its address space (before the filter and
    limits: 640 MiB of System V shared memory, 600 MiB in memfds, pipes of 1 MiB, 16 MiB socket buffers, 2000 open
    files, 5000 inotify watches and counting, a nested user namespace, 105k files in /tmp in ~4 s)."""
    answers = check_memory_outside_the_address_space_is_bounded()
    # 64 files per MiB of scratch_mb (64): 4096 inodes, the root folder one of them. How many of the rest are free
    # depends on where the clone and its interpreter live (a path under /tmp is mounted inside the scratch folder and
    # takes some), so the bound is asserted as a bound: never more than the budget, and the kernel's ENOSPC stops it
    created, error = answers.pop("files").removeprefix("files ").split(" ", 1)
    assert int(created) <= 4095 and error == "No space left on device"
    assert answers == {
        "shm": "shm 0 MiB 1",
        "memfd": "memfd 0 MiB Operation not permitted",
        "ipc": "msgget -1 1\nsemget -1 1\nmq_open -1 1",
        "buffers": "pipe Operation not permitted\nsndbuf Operation not permitted\nopen files refused at 64 Too many open files",
        "inotify": "inotify_init1 -1 1",
        "nested": "unshare -1 1",
    }


def test_no_unix_socket_of_the_host_is_reachable(tmp_path, monkeypatch):
    """Sockets a trainer binds in a mounted folder (a virtual environment in the working folder), open to every user."""
    assert check_no_unix_socket_of_the_host_is_reachable(tmp_path, monkeypatch).splitlines() == [
        "stream Operation not permitted",
        "datagram Operation not permitted",
    ]


def test_what_the_filter_leaves(tmp_path):
    """The filter refuses only what it names: a connected socket pair, a pipe, setsockopt of other options, threads and a
    subprocess still work."""
    code = (
        "import fcntl, os, socket, subprocess, sys, threading\na, b = socket.socketpair()\na.sendall(b'pair'); print(b.recv(4).decode())\n"
        "a.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1); print(a.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE))\n"
        "r, w = os.pipe(); print(fcntl.fcntl(w, 1032))\n"  # F_GETPIPE_SZ: the default 64 KiB
        "t = threading.Thread(target=print, args=('thread',)); t.start(); t.join()\n"
        "print(subprocess.run([sys.executable, '-c', 'print(6 * 7)'], capture_output=True, text=True).stdout.strip())"
    )
    assert PythonTool(timeout_s=10.0)(code).splitlines() == ["pair", "1", "65536", "thread", "42"]


def test_a_host_abstract_socket_is_unreachable_with_the_network():
    """network: true shares the host's network namespace, where abstract Unix sockets live: none can be opened."""
    name = f"\0lightning-rl-{uuid.uuid4().hex}"
    with socket.socket(socket.AF_UNIX) as server:
        server.bind(name)
        server.listen()
        answer = attempt(
            PythonTool(network=True),
            f"import socket\ntry: socket.socket(socket.AF_UNIX).connect({name!r}); print('connected')\nexcept OSError as err: print(err.strerror)",
        )
    assert answer == "Operation not permitted"


def test_without_the_network_no_socket_family_opens():
    """Every family 0..AF_MAX-1, as a stream and a datagram socket, is the filter's EPERM, not the kernel's answer (the
    old filter refused AF_UNIX only: AF_INET, AF_INET6 and AF_VSOCK, a virtual machine's way to its hypervisor, opened;
    the rest answered EAFNOSUPPORT or ESOCKTNOSUPPORT, which a kernel module loaded later would turn into a socket)."""
    outcomes = check_socket_families(network=False)
    assert sorted(outcomes) == list(range(46))
    assert {family: kinds for family, kinds in outcomes.items() if kinds != ["EPERM", "EPERM"]} == {}


def test_with_the_network_only_ipv4_and_ipv6_open():
    outcomes = check_socket_families(network=True)
    refused = {family for family, kinds in outcomes.items() if kinds == ["EPERM", "EPERM"]}
    assert refused == set(range(46)) - {AF_INET, AF_INET6}
    assert outcomes[AF_INET] == ["opened", "opened"]
    # the C library's resolver asks netlink (refused) which addresses the host has, and assumes both when it cannot
    resolved = attempt(
        PythonTool(network=True), "import socket; print(sorted({a[4][0] for a in socket.getaddrinfo('localhost', 80)}))"
    )
    assert "127.0.0.1" in resolved, resolved


def test_a_file_too_large_names_what_was_exceeded():
    tool = PythonTool()
    limit = "passed 1048576 bytes, the limit on each file it writes (File too large)"
    assert attempt(tool, "open('/tmp/big', 'wb').write(b'x' * (2 << 20))") == f"error: a file the program wrote {limit}"
    assert attempt(tool, "print('x' * (2 << 20))") == f"error: the program's standard output {limit}"
    assert (
        attempt(tool, "import sys; sys.stderr.write('e' * (2 << 20))") == f"error: the program's standard error {limit}"
    )
