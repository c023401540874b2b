"""A cgroup v2 device filter: a BPF_PROG_TYPE_CGROUP_DEVICE program, loaded and attached through
``bpf(2)`` with ctypes (no libbpf, no compiler on the node).

cgroup v2 has no ``devices`` controller; the kernel asks the BPF programs attached to a cgroup (and
its ancestors) whether a process there may open or mknod a device node. The program built here
answers one question only: for each *fenced* character-device major it allows the listed minors
and denies the rest; every other device is allowed, so what the node's own policy (systemd's
``DevicePolicy=``, a container runtime's filter on an ancestor) allows or denies stays as it was:
with ``BPF_F_ALLOW_MULTI`` every program on the path runs and all must allow.

The instruction layout follows runc's ``libcontainer/cgroups/devices/ebpf`` and systemd's
``src/core/bpf-devices.c``: load ``bpf_cgroup_dev_ctx`` (access type and device type in one word,
then major, minor), compare, ``r0 = 1`` (allow) or ``r0 = 0`` (deny), exit.

Attached with ``BPF_PROG_ATTACH`` (not a BPF link), the program stays with the cgroup after the
file descriptor here is closed and goes with the cgroup when it is removed. Standard library only.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import platform
import resource
import struct
from dataclasses import dataclass

# From include/uapi/linux/bpf.h.
BPF_PROG_LOAD = 5
BPF_PROG_ATTACH = 8
BPF_PROG_QUERY = 16
BPF_PROG_TYPE_CGROUP_DEVICE = 15
BPF_CGROUP_DEVICE = 6
BPF_F_ALLOW_MULTI = 2
BPF_DEVCG_DEV_CHAR = 2

_SYSCALL_BPF = {"x86_64": 321, "aarch64": 280, "ppc64le": 361, "s390x": 351}

# Opcodes (include/uapi/linux/bpf_common.h, bpf.h).
_LDX_MEM_W = 0x61  # BPF_LDX | BPF_MEM | BPF_W
_ALU64_AND_K = 0x57
_MOV64_K = 0xB7
_JEQ_K = 0x15
_JNE_K = 0x55
_JA = 0x05
_EXIT = 0x95


class BpfError(OSError):
    """The kernel refused to load or attach the program; ``strerror`` says why."""


@dataclass(frozen=True)
class DeviceRule:
    """Character devices of ``major``: only ``minors`` may be opened (none: the whole major is denied)."""

    major: int
    minors: frozenset[int]


def _insn(code: int, dst: int = 0, src: int = 0, off: int = 0, imm: int = 0) -> bytes:
    return struct.pack("<BBhi", code, (src << 4) | dst, off, imm)


def device_program(rules: list[DeviceRule]) -> bytes:
    """The program's instructions: deny the fenced majors' minors that are not listed, allow all else."""
    body: list[tuple] = []  # (code, dst, src, off or a label, imm); labels resolved below
    body.append((_LDX_MEM_W, 2, 1, 0, 0))  # r2 = ctx->access_type
    body.append((_ALU64_AND_K, 2, 0, 0, 0xFFFF))  # r2 = device type (block, char)
    body.append((_LDX_MEM_W, 3, 1, 4, 0))  # r3 = ctx->major
    body.append((_LDX_MEM_W, 4, 1, 8, 0))  # r4 = ctx->minor
    body.append((_JNE_K, 2, 0, "allow", BPF_DEVCG_DEV_CHAR))
    for n, rule in enumerate(rules):
        body.append((_JNE_K, 3, 0, f"next{n}", rule.major))
        for minor in sorted(rule.minors):
            body.append((_JEQ_K, 4, 0, "allow", minor))
        body.append((_JA, 0, 0, "deny", 0))
        body.append(f"next{n}")
    body.append("allow")
    body.append((_MOV64_K, 0, 0, 0, 1))
    body.append((_EXIT, 0, 0, 0, 0))
    body.append("deny")
    body.append((_MOV64_K, 0, 0, 0, 0))
    body.append((_EXIT, 0, 0, 0, 0))
    labels, position = {}, 0
    for item in body:
        if isinstance(item, str):
            labels[item] = position
        else:
            position += 1
    code, position = b"", 0
    for item in body:
        if isinstance(item, str):
            continue
        op, dst, src, off, imm = item
        if isinstance(off, str):
            off = labels[off] - position - 1  # jumps count from the next instruction
        code += _insn(op, dst, src, off, imm)
        position += 1
    return code


class _ProgLoad(ctypes.Structure):
    _fields_ = [("prog_type", ctypes.c_uint32), ("insn_cnt", ctypes.c_uint32), ("insns", ctypes.c_uint64),
                ("license", ctypes.c_uint64), ("log_level", ctypes.c_uint32), ("log_size", ctypes.c_uint32),
                ("log_buf", ctypes.c_uint64), ("kern_version", ctypes.c_uint32), ("prog_flags", ctypes.c_uint32),
                ("prog_name", ctypes.c_char * 16), ("prog_ifindex", ctypes.c_uint32),
                ("expected_attach_type", ctypes.c_uint32)]


class _ProgAttach(ctypes.Structure):
    _fields_ = [("target_fd", ctypes.c_uint32), ("attach_bpf_fd", ctypes.c_uint32),
                ("attach_type", ctypes.c_uint32), ("attach_flags", ctypes.c_uint32)]


class _ProgQuery(ctypes.Structure):
    _fields_ = [("target_fd", ctypes.c_uint32), ("attach_type", ctypes.c_uint32), ("query_flags", ctypes.c_uint32),
                ("attach_flags", ctypes.c_uint32), ("prog_ids", ctypes.c_uint64), ("prog_cnt", ctypes.c_uint32)]


def _bpf(cmd: int, attr: ctypes.Structure) -> int:
    number = _SYSCALL_BPF.get(platform.machine())
    if number is None:
        raise BpfError(errno.ENOSYS, f"bpf(2) is not wired for {platform.machine()} here")
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    result = libc.syscall(ctypes.c_long(number), ctypes.c_int(cmd), ctypes.byref(attr),
                          ctypes.c_uint(ctypes.sizeof(attr)))
    if result < 0:
        code = ctypes.get_errno()
        raise BpfError(code, os.strerror(code))
    return result


def load_device_program(rules: list[DeviceRule]) -> int:
    """Load the filter; its file descriptor (BpfError: the verifier's log in the message)."""
    code = device_program(rules)
    insns = ctypes.create_string_buffer(code, len(code))
    license_ = ctypes.create_string_buffer(b"GPL")
    log = ctypes.create_string_buffer(4096)
    attr = _ProgLoad(prog_type=BPF_PROG_TYPE_CGROUP_DEVICE, insn_cnt=len(code) // 8,
                     insns=ctypes.addressof(insns), license=ctypes.addressof(license_), log_level=1,
                     log_size=len(log), log_buf=ctypes.addressof(log), prog_name=b"colony_devices",
                     expected_attach_type=BPF_CGROUP_DEVICE)
    try:
        return _bpf(BPF_PROG_LOAD, attr)
    except BpfError as exc:
        if exc.errno == errno.EPERM and _raise_memlock():
            # Kernels before 5.11 charge BPF memory to RLIMIT_MEMLOCK (64 KiB by default).
            return _bpf(BPF_PROG_LOAD, attr)
        if exc.errno == errno.EINVAL and log.value:
            verifier_log = log.value.decode("utf-8", "replace").strip()[-300:]
            raise BpfError(exc.errno, f"{exc.strerror}: {verifier_log}") from None
        raise


def _raise_memlock() -> bool:
    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
        if soft == resource.RLIM_INFINITY:
            return False
        resource.setrlimit(resource.RLIMIT_MEMLOCK, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
        return True
    except (OSError, ValueError):
        return False


def attach_device_filter(cgroup: str | os.PathLike, rules: list[DeviceRule]) -> None:
    """Attach a filter with ``rules`` to the cgroup v2 directory ``cgroup`` (BpfError if refused)."""
    prog = load_device_program(rules)
    try:
        target = os.open(cgroup, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            _bpf(BPF_PROG_ATTACH, _ProgAttach(target_fd=target, attach_bpf_fd=prog,
                                              attach_type=BPF_CGROUP_DEVICE, attach_flags=BPF_F_ALLOW_MULTI))
        finally:
            os.close(target)
    finally:
        os.close(prog)  # the attachment holds the program now


def attached_programs(cgroup: str | os.PathLike) -> int:
    """How many device programs are attached to ``cgroup`` itself (BpfError if it cannot be asked)."""
    target = os.open(cgroup, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        ids = (ctypes.c_uint32 * 64)()
        query = _ProgQuery(target_fd=target, attach_type=BPF_CGROUP_DEVICE, prog_ids=ctypes.addressof(ids), prog_cnt=64)
        _bpf(BPF_PROG_QUERY, query)
        return query.prog_cnt
    finally:
        os.close(target)
