"""The sandbox's seccomp filter, run by a small classic-BPF interpreter written here (the kernel runs it in the sandbox
tests, tests/components/test_sandbox.py, but only for this machine's architecture)."""

from __future__ import annotations

import struct

import pytest

from components.env.syscall_filter import refusal_filter

ALLOW, KILL, EPERM, ENOSYS = 0x7FFF0000, 0x80000000, 0x00050001, 0x00050026
AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7, "riscv64": 0xC00000F3, "i386": 0x40000003}


def verdict(program: bytes, arch: int, nr: int, *args: int) -> int:
    """What the filter returns for a call: struct seccomp_data {int nr; u32 arch; u64 ip; u64 args[6]} (little-endian)."""
    data = struct.pack("<iIQ6Q", nr, arch, 0, *args, *[0] * (6 - len(args)))
    instructions = [struct.unpack("=HBBI", program[i : i + 8]) for i in range(0, len(program), 8)]
    pc, accumulator = 0, 0
    while True:
        code, jt, jf, k = instructions[pc]
        if code == 0x20:  # BPF_LD | BPF_W | BPF_ABS
            accumulator = struct.unpack_from("<I", data, k)[0]
        elif code == 0x54:  # BPF_ALU | BPF_AND | BPF_K
            accumulator &= k
        elif code in (0x15, 0x35):  # BPF_JMP | BPF_JEQ / BPF_JGE | BPF_K
            taken = accumulator == k if code == 0x15 else accumulator >= k
            pc += jt if taken else jf
        elif code == 0x06:  # BPF_RET | BPF_K
            return k
        else:
            raise AssertionError(f"unexpected opcode {code:#x}")
        pc += 1


@pytest.mark.parametrize(
    "machine, numbers",
    [
        # socket, socketpair, setsockopt, fcntl, clone, unshare, clone3, keyctl, memfd_create, shmget, read
        ("x86_64", (41, 53, 54, 72, 56, 272, 435, 250, 319, 29, 0)),
        ("aarch64", (198, 199, 208, 25, 220, 97, 435, 219, 279, 194, 63)),
        ("riscv64", (198, 199, 208, 25, 220, 97, 435, 219, 279, 194, 63)),
    ],
)
def test_each_refusal_by_its_arguments(machine, numbers):
    socket, socketpair, setsockopt, fcntl, clone, unshare, clone3, keyctl, memfd_create, shmget, read = numbers
    program, arch = refusal_filter(machine, network=False), AUDIT_ARCH[machine]
    cases = {
        (read, 3): ALLOW,
        (keyctl, 11): EPERM,
        (memfd_create, 0): EPERM,
        (shmget, 0): EPERM,
        (socket, 1, 1): EPERM,  # AF_UNIX
        (socket, 2, 1): EPERM,  # AF_INET: no family at all without network: true
        (socketpair, 1, 1 | 0x80000): ALLOW,  # AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC
        (socketpair, 1, 5): ALLOW,  # SOCK_SEQPACKET
        (socketpair, 1, 2): EPERM,  # SOCK_DGRAM: sendto() may name any socket file
        (setsockopt, 3, 1, 7): EPERM,  # SOL_SOCKET, SO_SNDBUF
        (setsockopt, 3, 1, 33): EPERM,  # SO_RCVBUFFORCE
        (setsockopt, 3, 1, 9): ALLOW,  # SO_KEEPALIVE
        (setsockopt, 3, 6, 7): ALLOW,  # IPPROTO_TCP, option 7 (not SO_SNDBUF at that level)
        (fcntl, 3, 1031): EPERM,  # F_SETPIPE_SZ
        (fcntl, 3, 1032): ALLOW,  # F_GETPIPE_SZ
        (clone, 0x01200011): ALLOW,  # fork(): CLONE_CHILD_SETTID | CLONE_CHILD_CLEARTID | SIGCHLD
        (clone, 0x10000000 | 17): EPERM,  # CLONE_NEWUSER
        (unshare, 0x10000000 | 0x00020000): EPERM,
        (unshare, 0x00000400): ALLOW,  # CLONE_FILES
        (clone3, 0): ENOSYS,  # glibc falls back to clone
        (socket, 1 | (1 << 32), 1): EPERM,  # the kernel reads an int: high bits set change nothing
    }
    assert {call: verdict(program, arch, *call) for call in cases} == cases
    assert verdict(program, AUDIT_ARCH["i386"], 0) == KILL  # another ABI's numbers would slip past the table
    if machine == "x86_64":
        assert verdict(program, arch, 0x40000000 | memfd_create) == EPERM  # x32


def test_an_unknown_machine_is_named():
    with pytest.raises(OSError, match="does not know the system-call numbers of ppc64le"):
        refusal_filter("ppc64le", network=False)


AF_MAX = 46  # include/linux/socket.h (Linux 5.15+: AF_MCTP 45 is the last family)
AF_UNIX, AF_INET, AF_INET6, AF_NETLINK, AF_PACKET, AF_VSOCK = 1, 2, 10, 16, 17, 40


@pytest.mark.parametrize(
    "machine, socket, socketpair", [("x86_64", 41, 53), ("aarch64", 198, 199), ("riscv64", 198, 199)]
)
def test_socket_families_are_an_allow_list(machine, socket, socketpair):
    """Every family 0..AF_MAX-1 (and past it): none without the network, IPv4 and IPv6 with it; a socket pair only of
    AF_UNIX. Was a list of one refusal (AF_UNIX): AF_VSOCK, AF_NETLINK, AF_PACKET... were open."""
    arch, families = AUDIT_ARCH[machine], [*range(AF_MAX), 255, 1 << 16]
    for network, allowed in ((False, set()), (True, {AF_INET, AF_INET6})):
        program = refusal_filter(machine, network=network)
        for kind in (1, 2, 3, 5, 1 | 0x80000 | 0x800):  # stream, datagram, raw, seqpacket, stream | CLOEXEC | NONBLOCK
            opened = {f for f in families if verdict(program, arch, socket, f, kind, 0) == ALLOW}
            assert opened == allowed, (network, kind)
            # the kernel reads an int: high bits change nothing
            assert verdict(program, arch, socket, AF_INET | (1 << 32), kind, 0) == (ALLOW if network else EPERM)
            paired = {f for f in families if verdict(program, arch, socketpair, f, kind, 0) == ALLOW}
            assert paired == ({AF_UNIX} if (kind & 0xF) in (1, 5) else set()), (network, kind)
