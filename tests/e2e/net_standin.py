"""Stand-ins for real internet hosts on a `TestInternet` (net.py): an address of their own in its
public namespace, the real names (`pypi.org`, `api.anthropic.com`, ...) answered there by the
proxy's test DNS table, a server of the test's own on port 443, and, for a client inside a
sandbox that checks TLS against the system's trust store as it is (pip), a box whose sandboxes
see that store with the stand-in's CA added.

    with TestInternet() as net:
        address = extra_address(net, 4)           # 198.18.X.4, in net's public namespace
        point(net, ["pypi.org"], address)          # the proxy now dials it for pypi.org
        with serve(net, address, SCRIPT, args):    # prints `ready`; killed on exit
            ...
        wrap = trusting_box(bundle_with(ca, tmp))  # `lnk box up` under this argv prefix

`trusting_box`: the box's services start in a mount namespace of their own (`unshare --mount`,
propagation slave: the host's mounts still reach them, theirs never reach the host) in which
`/etc/ssl/certs/ca-certificates.crt` is a bundle of the host's roots and the test CA. The
controller copies `/etc/ssl` into each sandbox from its own view, so the sandbox's pip trusts
the stand-in while this machine's store is untouched. The namespace ends with the services.

Security limitations: none needed; test code. Only addresses of the TestInternet's own subnet
are added, inside its namespace (gone with it).
"""

from __future__ import annotations

import select
import subprocess
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

SYSTEM_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")  # Debian's, what its pip reads
READY_TIMEOUT_S = 10.0  # a stand-in binds in ~0.1 s; far slower means something is broken
FIRST_FREE_HOST = 4  # .1 is root's side, .2 www, .3 other (net.py's layout)


def extra_address(net: Any, index: int) -> str:
    """Address `index` of the public subnet, added to its namespace (gone with it)."""
    if index < FIRST_FREE_HOST:
        raise ValueError(f"host {index} of the subnet is net.py's own")
    address = str(net.public_subnet[index])
    inner = net.public_veth[:-1] + "n"  # net.py's `_segment` names the namespace's side so
    prefixlen = net.public_subnet.prefixlen
    subprocess.run(
        ["ip", "-n", net.public_netns, "addr", "add", f"{address}/{prefixlen}", "dev", inner],
        check=True,
        capture_output=True,
    )
    return address


def point(net: Any, names: Sequence[str], address: str) -> None:
    """Answer each of `names` with `address` in the proxy's test DNS table (read per lookup)."""
    for name in names:
        net.dns[name] = [address]
    net._write_dns()


@contextmanager
def serve(net: Any, script: Path, args: Sequence[str], errors: Path) -> Iterator[None]:
    """`python -I script *args` in net's public namespace, once it printed `ready`."""
    argv = ["ip", "netns", "exec", net.public_netns, sys.executable, "-I", str(script), *args]
    with errors.open("wb") as err:
        server = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=err
        )
    assert server.stdout is not None
    try:
        ready, _, _ = select.select([server.stdout], [], [], READY_TIMEOUT_S)
        line = server.stdout.readline() if ready else b""
        assert line == b"ready\n", f"{script.name} did not start: {errors.read_text()}"
        yield
    finally:
        server.kill()
        server.wait()
        server.stdout.close()


def bundle_with(ca_file: Path, directory: Path) -> Path:
    """The host's trust bundle and `ca_file`, in `directory` (world-readable, as the store)."""
    bundle = directory / "ca-certificates.crt"
    bundle.write_bytes(SYSTEM_BUNDLE.read_bytes() + b"\n" + ca_file.read_bytes())
    bundle.chmod(0o644)
    return bundle


def trusting_box(bundle: Path) -> list[str]:
    """The argv prefix under which `lnk box up` starts services whose sandboxes trust `bundle`."""
    mount = 'mount --bind "$0" /etc/ssl/certs/ca-certificates.crt && exec "$@"'
    return ["unshare", "--mount", "--propagation", "slave", "--", "sh", "-c", mount, str(bundle)]
