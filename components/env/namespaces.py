"""The sandbox's launcher: one program in new user, PID, mount, IPC, UTS, cgroup (and network) namespaces, Linux only.

Run by components.env.sandbox as ``python -I -S namespaces.py`` with a JSON spec on stdin; the standard library
only (ctypes on libc), since nothing of the project is visible inside. Four processes:

    launcher  outside: writes the holder's uid/gid maps (only a process outside the new user namespace may)
    holder    unshares the namespaces, waits for init, kills it at ``timeout_s``
    init      pid 1 of the new PID namespace: builds the new root, starts the program, reaps; when it exits the
              kernel kills every process left in the namespace (a double fork + setsid survives nothing)
    program   the new root's ``/tmp`` (a tmpfs bounded in bytes and files) as its only writable place, rlimits, no
              capabilities, no new privileges, the system-call filter (``filter``: components.env.syscall_filter);
              then ``execve``

The new root is a read-only tmpfs holding read-only binds (``mounts``: the interpreter, ``/usr``, ``/lib*``, a few
``/etc`` files; empty folders over the trainer's home and working folder where they lie under one), ``devices``,
a ``/proc`` of the new PID namespace and the scratch tmpfs. The trainer's ``/proc``, home, working folder and
everything else are not mounted. A trainer running as real root is mapped to uid 1 inside (init builds the root
with its rights) and the program to uid 0 = the host's ``nobody`` (65534): the kernel exempts real root from
RLIMIT_NPROC, and nobody owns nothing on the host. A trainer's other uid is mapped to 0 and kept.

Status lines go to ``status_fd`` (closed by the program's ``execve``, so the program cannot write them): ``exit N``,
``signal N``, ``timeout`` or ``error MESSAGE``.
"""

import ctypes
import json
import os
import resource
import signal
import sys

CLONE_NEWNS, CLONE_NEWCGROUP, CLONE_NEWUTS, CLONE_NEWIPC = 0x00020000, 0x02000000, 0x04000000, 0x08000000
CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x10000000, 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT = 1, 2, 4, 8, 32
MS_NOATIME, MS_NODIRATIME, MS_BIND, MS_REC, MS_PRIVATE, MS_RELATIME = 1024, 2048, 4096, 16384, 1 << 18, 1 << 21
MNT_DETACH = 2
PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_SET_SECCOMP, PR_CAPBSET_DROP, PR_SET_SECUREBITS = 1, 4, 22, 24, 28
PR_SET_NO_NEW_PRIVS, PR_CAP_AMBIENT, SECCOMP_MODE_FILTER = 38, 47, 2
SECURE_NOROOT_LOCKED_ALL = (
    0b11111111  # NOROOT, NO_SETUID_FIXUP, KEEP_CAPS (off), NO_CAP_AMBIENT_RAISE: each set and locked
)
SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "riscv64": 41, "ppc64le": 203, "s390x": 217}
NOBODY = 65534
MASKED_PROC_FILES = ("/proc/keys", "/proc/key-users")
# statvfs flag -> the mount flag a remount must repeat (a user namespace may not clear the flags its mounts came with)
LOCKED_FLAGS = {
    os.ST_NOSUID: MS_NOSUID,
    os.ST_NODEV: MS_NODEV,
    os.ST_NOEXEC: MS_NOEXEC,
    os.ST_NOATIME: MS_NOATIME,
    os.ST_NODIRATIME: MS_NODIRATIME,
    os.ST_RELATIME: MS_RELATIME,
}

libc = ctypes.CDLL(None, use_errno=True)
libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]
libc.unshare.argtypes = [ctypes.c_int]
libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]


class SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def check(result: int, what: str) -> None:
    if result != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{what}: {os.strerror(errno)}")


def mount(source, target: str, fstype=None, flags: int = 0, data=None) -> None:
    encode = lambda s: None if s is None else s.encode()  # noqa: E731
    check(
        libc.mount(encode(source), target.encode(), encode(fstype), flags, encode(data)), f"mount {source} on {target}"
    )


def prctl(option: int, arg: int = 0, arg3: int = 0) -> None:
    check(libc.prctl(option, arg, arg3, 0, 0), f"prctl({option}, {arg})")


def report(status_fd: int, line: str) -> None:
    os.write(status_fd, (line.replace("\n", " ") + "\n").encode())


def bind_read_only(source: str, target: str) -> None:
    """``source`` at ``target``, read-only with every mount below it, without setuid (the trainer's own mounts keep their
    other flags: a user namespace may only add to them)."""
    if os.path.isdir(source):
        os.makedirs(target, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(target), exist_ok=True)
        open(target, "a").close()
    mount(source, target, flags=MS_BIND | MS_REC)
    for point in mount_points_under(target):
        locked = sum(ms for st, ms in LOCKED_FLAGS.items() if os.statvfs(point).f_flag & st)
        mount(None, point, flags=MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | locked)


def mount_points_under(target: str) -> list[str]:
    points = []
    with open("/proc/self/mountinfo") as info:
        for line in info:
            point = line.split()[4]
            for escaped, char in (
                ("\\040", " "),
                ("\\011", "\t"),
                ("\\012", "\n"),
                ("\\134", "\\"),
            ):  # how mountinfo writes them
                point = point.replace(escaped, char)
            if point == target or point.startswith(target.rstrip("/") + "/"):
                points.append(point)
    return points


def build_root(spec: dict) -> None:
    """In init: the new root at ``spec['root']`` (an empty folder of the host), then pivot into it."""
    root = spec["root"]
    mount(None, "/", flags=MS_REC | MS_PRIVATE)  # nothing done here propagates back to the host
    mount("tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=0755")
    # the scratch folder first: an interpreter that lives under /tmp (a virtualenv there) is bound inside it, where
    # a later mount of the scratch would hide it
    os.makedirs(root + "/tmp")
    # nr_inodes: an empty file costs kernel memory (its inode and name) that size= does not count
    scratch = f"size={spec['scratch_mb']}m,nr_inodes={spec['scratch_files']},mode=1777"
    mount("tmpfs", root + "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, scratch)
    hidden = []
    for kind, path in spec["mounts"]:
        if kind == "bind":
            bind_read_only(path, root + path)
        else:  # an empty folder over it (read-only once the binds below it are made)
            mount("tmpfs", root + path, "tmpfs", MS_NOSUID | MS_NODEV, "size=64k,mode=0755")
            hidden.append(root + path)
    for device in spec["devices"]:
        os.makedirs(os.path.dirname(root + device), exist_ok=True)
        open(root + device, "a").close()
        mount(device, root + device, flags=MS_BIND)
    os.makedirs(root + "/proc")
    try:
        mount("proc", root + "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)  # this PID namespace's processes only
    except (
        PermissionError
    ):  # a container that masks parts of the host's /proc forbids a new one: none, rather than the host's
        pass
    else:  # the host's keys (their names, owners, sizes), whatever namespace reads them
        for masked in MASKED_PROC_FILES:
            if os.path.exists(root + masked):
                mount("/dev/null", root + masked, flags=MS_BIND)
    for path in hidden:
        mount(None, path, flags=MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)
    os.chdir(root)
    machine = os.uname().machine
    if machine not in SYS_PIVOT_ROOT:
        raise OSError(f"the pivot_root system call's number on {machine} is not known here")
    check(libc.syscall(SYS_PIVOT_ROOT[machine], b".", b"."), "pivot_root")
    check(libc.umount2(b".", MNT_DETACH), "umount the host's root")  # the host's tree is gone from this namespace
    os.chdir("/")
    mount(None, "/", flags=MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)


def become_program(spec: dict, last_cap: int, status_fd: int) -> None:
    """In the program's process, before ``execve``: its user, limits and no capabilities."""
    os.set_inheritable(status_fd, False)
    limits = dict(spec["limits"])
    if os.geteuid() != 0:  # a root trainer, mapped to 1: the program becomes 0, the host's nobody
        os.setgroups([])
        os.setresgid(0, 0, 0)
        os.setresuid(0, 0, 0)
    else:  # the trainer's own uid, which init and the holder share: the kernel counts them too
        limits["RLIMIT_NPROC"] += 2
    for name, value in limits.items():
        resource.setrlimit(getattr(resource, name), (value, value))
    for cap in range(last_cap + 1):
        prctl(PR_CAPBSET_DROP, cap)
    prctl(PR_SET_SECUREBITS, SECURE_NOROOT_LOCKED_ALL)  # uid 0 gains no capabilities at execve
    prctl(PR_CAP_AMBIENT, 4)  # PR_CAP_AMBIENT_CLEAR_ALL
    prctl(PR_SET_NO_NEW_PRIVS, 1)  # nor does a setuid binary
    os.chdir("/tmp")
    install_filter(bytes.fromhex(spec["filter"]))  # last: it refuses nothing the steps above need


def install_filter(program: bytes) -> None:
    """The seccomp filter ``program`` (``struct sock_filter`` array) on this process and every process it starts."""
    instructions = ctypes.create_string_buffer(program, len(program))
    fprog = SockFprog(len(program) // 8, ctypes.addressof(instructions))
    prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.addressof(fprog))


def init(spec: dict, status_fd: int) -> int:
    """Pid 1: build the root, run the program, reap every orphan until the program ends."""
    prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    with open("/proc/sys/kernel/cap_last_cap") as f:
        last_cap = int(f.read())
    build_root(spec)
    prctl(PR_SET_DUMPABLE, 0)  # the program may not open /proc/1/fd (the status pipe) or ptrace init
    program = os.fork()
    if program == 0:
        try:
            become_program(spec, last_cap, status_fd)
            os.execve(spec["argv"][0], spec["argv"], spec["env"])
        except BaseException as err:
            report(status_fd, f"error starting the program: {err}")
        os._exit(127)
    while True:
        pid, status = os.wait()
        if pid == program:
            report(
                status_fd,
                f"signal {os.WTERMSIG(status)}" if os.WIFSIGNALED(status) else f"exit {os.WEXITSTATUS(status)}",
            )
            return 0


def holder(spec: dict, status_fd: int, ready_w: int, go_r: int) -> int:
    prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    check(libc.unshare(CLONE_NEWUSER), "unshare(CLONE_NEWUSER)")
    os.write(ready_w, b"1")
    if os.read(go_r, 1) != b"1":
        return 1  # the launcher could not map us; it reported why
    flags = (
        CLONE_NEWNS
        | CLONE_NEWPID
        | CLONE_NEWIPC
        | CLONE_NEWUTS
        | CLONE_NEWCGROUP
        | (0 if spec["network"] else CLONE_NEWNET)
    )
    check(libc.unshare(flags), "unshare(mount, PID, IPC, UTS, cgroup, network namespaces)")
    pid = os.fork()
    if pid == 0:
        try:
            os._exit(init(spec, status_fd))
        except BaseException as err:
            report(status_fd, f"error in the sandbox's init: {err}")
            os._exit(1)
    timed_out = []
    signal.signal(signal.SIGALRM, lambda *_: (timed_out.append(True), os.kill(pid, signal.SIGKILL)))
    signal.setitimer(signal.ITIMER_REAL, spec["timeout_s"])
    os.waitpid(pid, 0)  # init's end is the namespace's: every process in it is gone when this returns
    signal.setitimer(signal.ITIMER_REAL, 0)
    if timed_out:
        report(status_fd, "timeout")
    return 0


def main() -> int:
    spec = json.load(sys.stdin)
    status_fd = spec["status_fd"]
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    ready_r, ready_w = os.pipe()
    go_r, go_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os._exit(holder(spec, status_fd, ready_w, go_r))
        except BaseException as err:
            report(status_fd, f"error: {err}")
            os._exit(1)
    os.close(ready_w)  # the holder's alone: one that fails before it is ready reads as end of file, not a wait forever
    try:
        if os.read(ready_r, 1) == b"1":
            uid, gid = os.geteuid(), os.getegid()
            if uid == 0:  # root maps itself to 1 (init needs a mapped id to build the root) and nobody to 0
                maps = {"uid_map": f"0 {NOBODY} 1\n1 0 1\n", "gid_map": f"0 {NOBODY} 1\n1 0 1\n"}
            else:
                maps = {"setgroups": "deny", "uid_map": f"0 {uid} 1\n", "gid_map": f"0 {gid} 1\n"}
            for name, text in maps.items():
                with open(f"/proc/{pid}/{name}", "w") as f:
                    f.write(text)
            os.write(go_w, b"1")
    except OSError as err:
        report(status_fd, f"error writing the sandbox's user namespace maps: {err}")
        os.write(go_w, b"0")
    os.waitpid(pid, 0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
