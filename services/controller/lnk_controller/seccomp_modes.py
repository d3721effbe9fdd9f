"""seccomp rules that keep what a sandbox leaves in a write grant from acting outside it.

A write grant is an idmapped mount: what the sandbox creates there is the owner's on the host.
So a set-uid or set-gid bit the sandbox sets makes a program that runs as the owner (as root,
when root runs the sandbox) for any local user who runs it, and a group or other write bit or a
POSIX ACL lets other local users write the owner's data. These rules refuse, before the kernel
acts, every call that would set them, reading the mode where the kernel takes it, in a register:

- `chmod`, `fchmod`, `fchmodat`, `fchmodat2`: a mode with S_ISUID, S_ISGID, S_IWGRP or S_IWOTH
  fails with EPERM (S_ISVTX is allowed: it only narrows who may delete);
- `open`, `openat` with O_CREAT or O_TMPFILE, `creat`, `mknod`, `mknodat`: a mode with S_ISUID
  or S_ISGID fails with EPERM (`mkdir` needs no rule: the kernel drops set-id bits from its
  mode). Group and other write bits are NOT refused here: every program asks for 0666 or 0777
  and relies on the umask, which a filter cannot see (see below);
- `openat2` fails with ENOSYS, as on an older kernel: its mode is in a struct in memory, which a
  filter cannot read; libc and every caller fall back to `openat`, whose mode it can;
- the extended-attribute writers `setxattr`, `lsetxattr`, `fsetxattr`, `setxattrat` and the
  removers `removexattr`, `lremovexattr`, `fremovexattr`, `removexattrat` fail with EOPNOTSUPP,
  what a filesystem without xattrs says (`cp -a`, `rsync -X`, `tar --xattrs` carry on): the
  attribute's name is a string in memory, so `system.posix_acl_access` and
  `system.posix_acl_default` (which can also change a file's group bits) cannot be told from
  `user.*`, and all are refused. Reading xattrs still works.

Security limitations: it does NOT stop
- group and other write bits that a creating call gets through a umask the sandbox cleared
  (`umask 0; mkdir d`): they are on disk while the sandbox runs, until the end-of-sandbox
  sweep (`leftover_modes`) strips them;
- modes set by something the filter does not see: a process outside the sandbox, or a
  kernel path with no syscall of its own here (none is known; io_uring is refused outright);
- what is already on disk: the owner's own set-id or group-writable files stay as they are,
  and a default ACL the owner put on a folder still applies to what is created in it;
- `chown`: the sandbox's ids map to the owner's, so it can only give files to the owner.
"""

from __future__ import annotations

import errno
import stat

__all__ = [
    "BY_NUMBER",
    "CREATE_REFUSED_BITS",
    "MODE_REFUSED_BITS",
    "SET_ID_BITS",
    "SHARED_WRITE_BITS",
    "mode_rules",
]

_CMP_MASKED_EQ = 7  # SCMP_CMP_MASKED_EQ: (argument & datum_a) == datum_b
_LOW32 = 0xFFFFFFFF

SET_ID_BITS = stat.S_ISUID | stat.S_ISGID  # a program that runs as its file's owner or group
SHARED_WRITE_BITS = stat.S_IWGRP | stat.S_IWOTH  # other local users write the owner's data
MODE_REFUSED_BITS = SET_ID_BITS | SHARED_WRITE_BITS  # for the chmod family
CREATE_REFUSED_BITS = SET_ID_BITS  # for creating calls (the umask decides their write bits)

O_CREAT = 0o100  # the same on x86_64 and aarch64
O_TMPFILE_BIT = 0o20000000  # __O_TMPFILE: an unnamed file, made with a mode like O_CREAT

# Syscalls newer than the libseccomp Debian ships (2.5.4 knows no name for them), by number:
# the generic table's numbers, the same on x86_64 and aarch64. A deny-list that cannot name a
# syscall would let it through.
BY_NUMBER: dict[str, int] = {
    "setxattrat": 463,  # Linux 6.13: setxattr relative to a directory descriptor
    "removexattrat": 466,  # Linux 6.13
}

_Cmp = tuple[int, int, int, int]
_Rules = tuple[tuple[_Cmp, ...], ...]
_ALWAYS: _Rules = ((),)


def _bits(value: int) -> tuple[int, ...]:
    return tuple(1 << n for n in range(value.bit_length()) if value >> n & 1)


def _mode_has_any(arg: int, refused: int) -> _Rules:
    """One rule per refused bit: the call fires when any of them is set in argument `arg`."""
    return tuple(((arg, _CMP_MASKED_EQ, bit, bit),) for bit in _bits(refused))


def _creating_mode_has_any(flags_arg: int, mode_arg: int, refused: int) -> _Rules:
    """Open calls: the mode counts only with O_CREAT or O_TMPFILE among the flags."""
    return tuple(
        ((flags_arg, _CMP_MASKED_EQ, flag, flag), (mode_arg, _CMP_MASKED_EQ, bit, bit))
        for flag in (O_CREAT, O_TMPFILE_BIT)
        for bit in _bits(refused)
    )


def mode_rules(*, set_id: bool = True, shared: bool = True) -> tuple[tuple[str, int, _Rules], ...]:
    """(syscall, errno, rules) refusing set-id modes (`set_id`) and group/other write modes
    and every xattr write (`shared`). Turning either off is for the `unsafe_…` test switches."""
    chmod_bits = (SET_ID_BITS if set_id else 0) | (SHARED_WRITE_BITS if shared else 0)
    create_bits = SET_ID_BITS if set_id else 0
    entries: list[tuple[str, int, _Rules]] = []
    if chmod_bits:
        entries += [
            ("chmod", errno.EPERM, _mode_has_any(1, chmod_bits)),
            ("fchmod", errno.EPERM, _mode_has_any(1, chmod_bits)),
            ("fchmodat", errno.EPERM, _mode_has_any(2, chmod_bits)),
            ("fchmodat2", errno.EPERM, _mode_has_any(2, chmod_bits)),
        ]
    if create_bits:
        entries += [
            ("open", errno.EPERM, _creating_mode_has_any(1, 2, create_bits)),
            ("openat", errno.EPERM, _creating_mode_has_any(2, 3, create_bits)),
            ("creat", errno.EPERM, _mode_has_any(1, create_bits)),
            ("mknod", errno.EPERM, _mode_has_any(1, create_bits)),
            ("mknodat", errno.EPERM, _mode_has_any(2, create_bits)),
        ]
    if set_id or shared:
        entries.append(("openat2", errno.ENOSYS, _ALWAYS))
    if shared:
        for name in ("setxattr", "lsetxattr", "fsetxattr", "setxattrat"):
            entries.append((name, errno.EOPNOTSUPP, _ALWAYS))
        for name in ("removexattr", "lremovexattr", "fremovexattr", "removexattrat"):
            entries.append((name, errno.EOPNOTSUPP, _ALWAYS))
    return tuple(entries)
