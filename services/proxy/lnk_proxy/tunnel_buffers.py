"""The kernel memory a tunnel may pin in the proxy, fixed, and each sandbox's budget for it.
Pure: the server keeps each sandbox's reserved bytes and asks `buffers_for` before any await.

Left to the kernel, a tunnel whose sandbox never reads pinned 32-39 MiB: the origin socket's
receive buffer autotuned to `tcp_rmem`'s maximum (32 MiB here) plus the unix send buffer and a
pipe, none of it charged to the sandbox. Here every buffer of a tunnel has a fixed size, set
before it is used (the origin socket's before `connect`, so the kernel never autotunes it and
the window it offers is sized from it; the sandbox side's before the tunnel's first byte), so
a tunnel's worst case is known (`TunnelBuffers.worst_case`), and a sandbox's tunnels together
reserve at most `BUDGET`:
- the first tunnels of a sandbox get `LARGE` sizes (a 1 GiB download at near direct speed)
  while the sandbox's large ones reserve at most `LARGE_SHARE` of its budget;
- later ones get `SMALL` sizes (a few round trips' worth on a LAN: slower, never stuck);
- once neither fits, a new tunnel is refused (`too-much-buffer`) at once.

The worst case counts what the kernel may hold for a tunnel on the proxy's side: the origin
socket's receive and send buffers and the proxy's end of the unix socket's send buffer, each
twice the size asked (`socket(7)`: the kernel doubles the value for its bookkeeping), and one
pipe per direction full.

Plain http exchanges get `PLAIN`: their origin sockets (new ones and the pool's, all dialed with
it) have fixed sizes too, and each exchange reserves `PLAIN.worst_case()` from the same budget
while it runs (`too-much-buffer` past it).

Hosted model exchanges (`hosted_relay`: the body read whole and judged, the provider dialed over
TLS) get `hosted_buffers(send_max)` for their upstream socket and reserve
`hosted_worst_case(body, buffers)` from the same budget (`hosted_budget`): those kernel buffers,
the body the exchange holds in user space (the client's bytes while they are read and judged,
then the proxy's serialisation alone while it is sent and the answer streams) and
`HOSTED_USER_SPACE`, the exchange's fixed buffers. Without it one sandbox's concurrent requests
of up to 32 MiB each pinned the proxy's memory uncharged. Only their receive buffer is fixed:
their send buffer is left to the kernel's autotuning (a fixed one cost ~1 ms of a 1 MiB request,
issue 18), which grows it to at most `net.ipv4.tcp_wmem`'s maximum, counted as that
(`tcp_send_max`, read once when the proxy starts: a later change of the sysctl is not seen).

Does NOT bound: the bytes a sandbox sent that wait in the proxy's unix receive queue (they are
charged to the sandbox's own socket's send buffer, in its own cgroup, and freed with it); a
plain http exchange's pooled 1 MiB user-space buffer per direction (`conn.BufferPool`, capped
for the whole proxy); idle pooled origin connections (no reservation: at most
`upstream_pool.PER_SANDBOX` per sandbox, an origin may fill each one's receive buffer, 512 KiB
as the kernel counts, until it is taken and dropped as unusable);
pages a spliced skb pins beyond the bytes it carries; a hosted body's parse while it is judged
(a few times the body in Python objects, charged to no sandbox: the judgement never awaits, so
the whole proxy holds one such parse at a time) and the allocator's keeping of freed memory;
a hosted answer's size (streamed a read at a time, never held whole); the machine's total
(sandboxes times `BUDGET`, with the descriptor cap of `descriptors` bounding how many tunnels
and exchanges exist at all).
"""

from __future__ import annotations

from dataclasses import dataclass

from lnk_shared.errors import StateError

__all__ = [
    "BUDGET",
    "HOSTED_RECEIVE",
    "HOSTED_USER_SPACE",
    "LARGE",
    "LARGE_SHARE",
    "PLAIN",
    "SMALL",
    "TunnelBuffers",
    "buffers_for",
    "hosted_buffers",
    "hosted_worst_case",
    "tcp_send_max",
]

KERNEL_DOUBLES = 2  # socket(7): SO_RCVBUF/SO_SNDBUF's value is doubled for the kernel's overhead
MiB = 1024 * 1024
KiB = 1024
UNIX_DEFAULT_SEND = 212_992  # net.core.wmem_default: a unix socket's send buffer, as counted


@dataclass(frozen=True)
class TunnelBuffers:
    """The sizes asked for one tunnel's buffers (bytes)."""

    name: str
    tcp_receive: int  # the origin socket's SO_RCVBUF: what the origin may send ahead
    tcp_send: int  # the origin socket's SO_SNDBUF: what waits for the origin to read; 0: not set
    unix_send: int  # the sandbox side's SO_SNDBUF: what waits for the sandbox to read
    pipe: int  # each direction's splice pipe (F_SETPIPE_SZ)
    # With tcp_send 0, the most the kernel's autotuning lets the origin socket's send buffer
    # grow to, as the kernel counts it (tcp_wmem's values are not doubled).
    tcp_send_autotuned: int = 0

    def worst_case(self) -> int:
        """The most the kernel holds for this tunnel on the proxy's side (see the module)."""
        sockets = self.tcp_receive + self.tcp_send + self.unix_send
        return KERNEL_DOUBLES * sockets + self.tcp_send_autotuned + 2 * self.pipe  # a pipe each way


# 1 MiB each (2 MiB as the kernel counts): bench/proxy.py --rounds 3 on this 2-core machine
# (loaded by other runs), 1 GiB medians: direct 413 MiB/s, through the relay 449 (109 %), the
# proxy alone 796. A window this size carries 1 Gbit/s up to ~16 ms of round trip; a longer,
# faster path (a far origin) is held to about window / RTT, the price of a known bound.
LARGE = TunnelBuffers("large", 1 * MiB, 1 * MiB, 1 * MiB, 1 * MiB)  # 8 MiB at worst
# 64 KiB each: the kernel's default pipe, a few round trips on a LAN; 512 KiB at worst.
SMALL = TunnelBuffers("small", 64 * KiB, 64 * KiB, 64 * KiB, 64 * KiB)
# A plain http exchange's origin socket: 256 KiB each way (a window for ~20 MB/s at 10 ms of
# round trip; bodies go through a user-space buffer, not splice: no pipe); the sandbox side is
# not set, so the kernel's default send buffer is counted (wmem_default, 208 KiB as it counts
# it). 1.2 MiB at worst.
PLAIN = TunnelBuffers("plain", 256 * KiB, 256 * KiB, UNIX_DEFAULT_SEND // KERNEL_DOUBLES, 0)
# A hosted model exchange's upstream TLS socket's receive buffer (answers are streamed events,
# read as they come): 512 KiB as the kernel counts it, where autotuning grew it toward tcp_rmem's
# maximum (32 MiB here); fixing it also took 0.15-0.21 ms off a 1 MiB request.
HOSTED_RECEIVE = 256 * KiB
# A hosted exchange's fixed user-space buffers, rounded up: the TLS ciphertext read buffer and
# the reused plaintext one (64 KiB each, `upstream_tls`), ciphertext waiting to be sent (under
# two 256 KiB write slices), one read of TLS records not yet decrypted (64 KiB), the client's
# buffer (a head and one 64 KiB read), one answer read on its way out and the scrubber's and
# chunk decoder's carry (~128 KiB), OpenSSL's own connection state (~100 KiB).
HOSTED_USER_SPACE = 1280 * KiB
# A sandbox's tunnels together: 16 large ones (64 MiB) and 384 small ones could use it, more
# than `max_tunnels_per_sandbox` (256) lets it open; ten sandboxes at their budget pin 2.5 GiB
# where one alone pinned 8-10 GiB before.
BUDGET = 256 * MiB
LARGE_SHARE = 4  # large tunnels reserve at most a quarter of the budget: the rest for many small


def buffers_for(reserved_large: int, reserved: int, budget: int = BUDGET) -> TunnelBuffers | None:
    """Sizes for a sandbox's next tunnel while its open tunnels reserve `reserved` bytes
    (`reserved_large` of them by large ones), or None when it is at its budget."""
    large = LARGE.worst_case()
    if reserved_large + large <= budget // LARGE_SHARE and reserved + large <= budget:
        return LARGE
    if reserved + SMALL.worst_case() <= budget:
        return SMALL
    return None


def tcp_send_max(tcp_wmem: str) -> int:
    """The most an autotuned TCP send buffer holds, from `/proc/sys/net/ipv4/tcp_wmem`'s text
    (min, default, max): a socket starts at the default and autotuning grows it to at most the
    max (tcp(7)), so the larger of the two. StateError when the text is not three sizes."""
    fields = tcp_wmem.split()
    if len(fields) != 3 or not all(f.isdigit() for f in fields):
        raise StateError(
            f"net.ipv4.tcp_wmem reads {tcp_wmem.strip()!r}, not three sizes: the proxy counts a "
            "hosted exchange's send buffer by its maximum: set it (sysctl) and start the proxy"
        )
    return max(int(fields[1]), int(fields[2]))


def hosted_buffers(send_max: int) -> TunnelBuffers:
    """A hosted exchange's upstream socket: `HOSTED_RECEIVE` fixed, its send buffer autotuned
    up to `send_max` (`tcp_send_max`), the sandbox side as plain http's. 4.7 MiB at worst with
    tcp_wmem's usual 4 MiB maximum."""
    unix = UNIX_DEFAULT_SEND // KERNEL_DOUBLES
    return TunnelBuffers("hosted", HOSTED_RECEIVE, 0, unix, 0, tcp_send_autotuned=send_max)


def hosted_worst_case(body: int, buffers: TunnelBuffers) -> int:
    """What one hosted model exchange holding `body` bytes of request body reserves, its
    upstream socket dialed with `buffers` (`hosted_buffers`)."""
    return buffers.worst_case() + HOSTED_USER_SPACE + body
