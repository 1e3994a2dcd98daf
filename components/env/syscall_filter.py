"""The sandbox's system-call filter: a seccomp BPF program (Linux's ``SECCOMP_MODE_FILTER``, seccomp(2)) that refuses
the calls which reach past the sandbox's namespaces or hold memory no limit counts.

Refused with ``EPERM`` (the program sees "Operation not permitted"):

* the kernel keyrings (``add_key``, ``request_key``, ``keyctl``): keyrings are not namespaced, and a key the trainer
  added to its session keyring is readable by any process that possesses the keyring or shares the key's uid;
* memory outside every rlimit: ``memfd_create`` and ``memfd_secret`` (a memfd's pages count against nothing until
  mapped), System V shared memory, message queues and semaphores (``shmget``, ``msgget``, ``semget``: they outlive
  the process that made them) and POSIX message queues (``mq_open``); ``bpf`` (its maps are charged to a memory
  cgroup only);
* sockets of every family the program does not need: ``socket()`` takes an allow-list of families, none without the
  network and ``AF_INET`` / ``AF_INET6`` with it (`NETWORK_FAMILIES`). A list of refusals would leave ``AF_VSOCK`` (a
  virtual machine's way to its hypervisor's services), ``AF_NETLINK`` (the kernel's routing and audit interfaces),
  ``AF_PACKET``, ``AF_BLUETOOTH``, ``AF_CAN`` and every family a later kernel adds open (a family this kernel lacks
  answers ``EAFNOSUPPORT`` only until its module loads). ``AF_UNIX`` stays refused with the network: a Unix socket could
  reach a socket file of the host under a mounted folder, or an abstract one in the host's network namespace.
  ``socketpair(AF_UNIX, ...)`` is allowed for the connected kinds (stream, seqpacket), which cannot be pointed
  elsewhere;
* ``io_uring_setup`` / ``_enter`` / ``_register``: io_uring opens sockets and files without system calls this
  filter would see;
* growing kernel buffers past their defaults: ``setsockopt(SOL_SOCKET, SO_SNDBUF | SO_RCVBUF | ...FORCE)`` and
  ``fcntl(F_SETPIPE_SZ)``, so that each open file holds at most the default pipe or socket buffer; ``inotify_init``,
  ``inotify_init1`` and ``fanotify_init`` (each watch pins kernel memory, up to a host-wide limit of ~1% of RAM);
* a new user namespace (``clone`` or ``unshare`` with ``CLONE_NEWUSER``): it would hold capabilities over namespaces of
  its own (an IPC namespace with the kernel's default limits, mounts of its own). ``clone3``, whose flags lie in
  memory a filter cannot read, answers ``ENOSYS``, on which the C library falls back to ``clone``.

A call of another architecture (a 32-bit ``int 0x80`` on x86-64) kills the process: its numbers differ and would slip
past the table; x32 calls (numbers with bit 30 set on x86-64) are refused. Only the architectures below have their
numbers here (all little-endian, which the offsets of the arguments' low words assume).

The filter is built here, in the trainer, and installed by the launcher (components.env.namespaces) just before the
program's ``execve``; it holds for every process the program starts.
"""

from __future__ import annotations

import errno
import struct

# struct seccomp_data: int nr; __u32 arch; __u64 instruction_pointer; __u64 args[6]; an argument's low word (all the
# kernel reads of an int argument) is its first on a little-endian machine
NR, ARCH, ARG0, ARG1, ARG2 = 0, 4, 16, 24, 32


# classic BPF opcodes
LD_W_ABS, ALU_AND_K, JEQ_K, JGE_K, RET_K = 0x20, 0x54, 0x15, 0x35, 0x06
RET_KILL_PROCESS, RET_ERRNO, RET_ALLOW = 0x80000000, 0x00050000, 0x7FFF0000
AF_UNIX, AF_INET, AF_INET6 = 1, 2, 10
SOCK_STREAM, SOCK_SEQPACKET, SOCK_TYPE_MASK = 1, 5, 0xF
NETWORK_FAMILIES = (AF_INET, AF_INET6)
"""The socket families a program run with ``network: true`` may open (IPv4 and IPv6: TCP, UDP and, where the host's
``net.ipv4.ping_group_range`` allows its user, ICMP echo; raw sockets need a capability the program does not hold).
Without the network it may open none (no interface is up in its namespace)."""
SOL_SOCKET, SO_SNDBUF, SO_RCVBUF, SO_SNDBUFFORCE, SO_RCVBUFFORCE = 1, 7, 8, 32, 33
F_SETPIPE_SZ = 1031
CLONE_NEWUSER = 0x10000000
X32_SYSCALL_BIT = 0x40000000

# the numbers of arch/x86/entry/syscalls/syscall_64.tbl and include/uapi/asm-generic/unistd.h (arm64, riscv64)
GENERIC = {
    "add_key": 217,
    "request_key": 218,
    "keyctl": 219,
    "memfd_create": 279,
    "memfd_secret": 447,
    "shmget": 194,
    "msgget": 186,
    "semget": 190,
    "mq_open": 180,
    "bpf": 280,
    "io_uring_setup": 425,
    "io_uring_enter": 426,
    "io_uring_register": 427,
    "socket": 198,
    "socketpair": 199,
    "setsockopt": 208,
    "fcntl": 25,
    "inotify_init1": 26,
    "fanotify_init": 262,
    "clone": 220,
    "unshare": 97,
    "clone3": 435,
}
X86_64 = {
    "add_key": 248,
    "request_key": 249,
    "keyctl": 250,
    "memfd_create": 319,
    "memfd_secret": 447,
    "shmget": 29,
    "msgget": 68,
    "semget": 64,
    "mq_open": 240,
    "bpf": 321,
    "io_uring_setup": 425,
    "io_uring_enter": 426,
    "io_uring_register": 427,
    "socket": 41,
    "socketpair": 53,
    "setsockopt": 54,
    "fcntl": 72,
    "inotify_init": 253,
    "inotify_init1": 294,
    "fanotify_init": 300,
    "clone": 56,
    "unshare": 272,
    "clone3": 435,
}
ARCHITECTURES = {  # machine -> (AUDIT_ARCH_*, its numbers)
    "x86_64": (0xC000003E, X86_64),
    "aarch64": (0xC00000B7, GENERIC),
    "riscv64": (0xC00000F3, GENERIC),
}
REFUSED = (
    "add_key",
    "request_key",
    "keyctl",
    "memfd_create",
    "memfd_secret",
    "shmget",
    "msgget",
    "semget",
    "mq_open",
    "bpf",
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
    "inotify_init",
    "inotify_init1",
    "fanotify_init",
)
"""Refused whatever their arguments (where the architecture has them)."""


def refusal_filter(machine: str, network: bool) -> bytes:
    """The filter for ``machine`` (``os.uname().machine``) as the bytes of its ``struct sock_filter`` array; ``network``:
    the program may open the `NETWORK_FAMILIES`' sockets."""
    if machine not in ARCHITECTURES:
        raise OSError(
            f"the sandbox's system-call filter does not know the system-call numbers of {machine} "
            f"(it knows {', '.join(ARCHITECTURES)})"
        )
    audit_arch, nr = ARCHITECTURES[machine]
    program = [
        ("ld", ARCH),
        ("jeq", audit_arch, None, "kill"),
        ("ld", NR),
        *([("jge", X32_SYSCALL_BIT, "deny", None)] if machine == "x86_64" else []),
        *[("jeq", nr[name], "deny", None) for name in REFUSED if name in nr],
        ("jeq", nr["clone3"], "enosys", None),
        ("jeq", nr["clone"], "namespace", None),
        ("jeq", nr["unshare"], "namespace", None),
        ("jeq", nr["socket"], "socket", None),
        ("jeq", nr["socketpair"], "socketpair", None),
        ("jeq", nr["setsockopt"], "setsockopt", None),
        ("jeq", nr["fcntl"], "fcntl", None),
        ("ret", RET_ALLOW),
        "namespace",  # clone(flags, ...), unshare(flags)
        ("ld", ARG0),
        ("and", CLONE_NEWUSER),
        ("jeq", CLONE_NEWUSER, "deny", "allow"),
        "socket",  # socket(domain, type, protocol): an allow-list of families
        ("ld", ARG0),
        *[("jeq", family, "allow", None) for family in (NETWORK_FAMILIES if network else ())],
        ("ret", RET_ERRNO | errno.EPERM),
        "socketpair",  # socketpair(domain, type, protocol, sv): a connected pair ignores any address it is given
        ("ld", ARG0),
        ("jeq", AF_UNIX, None, "deny"),
        ("ld", ARG1),
        ("and", SOCK_TYPE_MASK),  # without SOCK_NONBLOCK / SOCK_CLOEXEC
        ("jeq", SOCK_STREAM, "allow", None),
        ("jeq", SOCK_SEQPACKET, "allow", "deny"),
        "setsockopt",  # setsockopt(fd, level, optname, ...)
        ("ld", ARG1),
        ("jeq", SOL_SOCKET, None, "allow"),
        ("ld", ARG2),
        *[("jeq", option, "deny", None) for option in (SO_SNDBUF, SO_RCVBUF, SO_SNDBUFFORCE, SO_RCVBUFFORCE)],
        ("ret", RET_ALLOW),
        "fcntl",  # fcntl(fd, cmd, arg)
        ("ld", ARG1),
        ("jeq", F_SETPIPE_SZ, "deny", "allow"),
        "allow",
        ("ret", RET_ALLOW),
        "deny",
        ("ret", RET_ERRNO | errno.EPERM),
        "enosys",
        ("ret", RET_ERRNO | errno.ENOSYS),
        "kill",
        ("ret", RET_KILL_PROCESS),
    ]
    return _assemble(program)


def _assemble(program: list) -> bytes:
    """``program``: instructions ``(op, k[, jump if true, jump if false])`` (a jump target is a label, None: the next
    instruction) and labels (strings) before the instruction they name."""
    labels, instructions = {}, []
    for item in program:
        if isinstance(item, str):
            labels[item] = len(instructions)
        else:
            instructions.append(item)
    code = {"ld": LD_W_ABS, "and": ALU_AND_K, "jeq": JEQ_K, "jge": JGE_K, "ret": RET_K}
    out = b""
    for at, (op, k, *jumps) in enumerate(instructions):
        # a jump's offset counts the instructions it skips after this one (at most 255)
        jt, jf = (0 if target is None else labels[target] - at - 1 for target in (jumps or [None, None]))
        out += struct.pack("=HBBI", code[op], jt, jf, k)
    return out
