"""The confiner (the seed's `lnk-sandbox`): the last step inside the sandbox before the target.

bwrap starts it as the sandbox's user inside the new namespaces. It reads its policy from the
read-only file the controller bound in, closes every descriptor but stdio, applies Landlock
(filesystem read/write per grant, EXECUTE only for granted programs and the ELF loader, TCP and
scopes where the ABI has them), then the seccomp deny-list, then the unix-socket block, and
execs the target. If any step fails it prints what is missing and exits 126 without running
the target: it never falls back to running unconfined.

It imports only the standard library and the two enforcement modules, so it starts quickly.
"""

from __future__ import annotations

import os
import sys

from lnk_controller import landlock, seccomp
from lnk_shared.errors import LaunchRefused

POLICY_PATH = "/run/lnk-confiner/policy.json"
EXIT_CONFINEMENT_FAILED = 126  # the shell's "cannot execute": nothing of the target ran
MAX_POLICY_BYTES = 1 << 20  # the controller writes a few KiB


POLICY_HEADER = "lnk-confiner-policy 1"  # the format spawn.encode_policy writes
_FLAGS = ("scope_abstract_unix", "scope_signal", "block_unix_sockets")
_NUMBERS = ("min_abi", "unsafe_pretend_abi", "relay_port", "bridge_port")


def load_policy(path: str = POLICY_PATH) -> dict[str, object]:
    """Read the policy: tab-separated (key, value) lines under a header; anything else refuses.
    (Not JSON: importing json costs more than the rest of the confiner's start.)"""
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_POLICY_BYTES + 1)
    except OSError as exc:
        raise LaunchRefused("confiner policy", f"cannot read {path}: {exc.strerror}") from None
    if len(data) > MAX_POLICY_BYTES:
        raise LaunchRefused("confiner policy", "the policy is too large")
    lines = data.decode("utf-8", "strict").split("\n")
    if lines[0] != POLICY_HEADER or lines[-1] != "":
        raise LaunchRefused("confiner policy", f"{path} is not a policy of this version")
    policy: dict[str, object] = {"read": [], "write": [], "execute": []}
    for line in lines[1:-1]:
        key, sep, value = line.partition("\t")
        if not sep:
            raise LaunchRefused("confiner policy", f"a line without a value: {line!r}")
        if key in ("read", "write", "execute"):
            _list(policy, key).append(value)
        elif key == "relay_localhost":
            _list(policy, key).append(_number(key, value))
        elif key in ("tcp_connect", "tcp_bind"):
            ports = _list(policy, key)
            if value != "-":
                ports.append(_number(key, value))
        elif key in ("relay_socket", "bridge_socket") and value.startswith("/"):
            policy[key] = value
        elif key in _FLAGS and value in ("0", "1"):
            policy[key] = value == "1"
        elif key in _NUMBERS:
            policy[key] = _number(key, value)
        else:
            raise LaunchRefused("confiner policy", f"unknown line: {line!r}")
    return policy


def _list(policy: dict[str, object], key: str) -> list[object]:
    value = policy.setdefault(key, [])
    assert isinstance(value, list)
    return value


def _number(key: str, text: str) -> int:
    if not text.isascii() or not text.isdigit() or len(text) > 6:
        raise LaunchRefused("confiner policy", f"{key} must be a number, not {text!r}")
    return int(text)


def _tuple(policy: dict[str, object], key: str) -> tuple[str, ...]:
    value = policy.get(key, [])
    if not isinstance(value, list) or not all(isinstance(p, str) for p in value):
        raise LaunchRefused("confiner policy", f"{key} must be a list of paths")
    return tuple(value)


def _ports(policy: dict[str, object], key: str) -> tuple[int, ...] | None:
    value = policy.get(key)
    if value is None:
        return None
    if not isinstance(value, list) or not all(type(p) is int for p in value):
        raise LaunchRefused("confiner policy", f"{key} must be a list of ports")
    return tuple(value)


def confine(policy: dict[str, object]) -> None:
    """Apply every layer, in order; raises LaunchRefused on the first that cannot be applied."""
    pretend = policy.get("unsafe_pretend_abi")
    min_abi = policy.get("min_abi", 1)
    if not isinstance(min_abi, int) or (pretend is not None and not isinstance(pretend, int)):
        raise LaunchRefused("confiner policy", "min_abi and unsafe_pretend_abi must be integers")
    landlock.apply(
        landlock.LandlockPolicy(
            read=_tuple(policy, "read"),
            write=_tuple(policy, "write"),
            execute=_tuple(policy, "execute"),
            tcp_connect=_ports(policy, "tcp_connect"),
            tcp_bind=_ports(policy, "tcp_bind"),
            scope_abstract_unix=bool(policy.get("scope_abstract_unix", True)),
            scope_signal=bool(policy.get("scope_signal", True)),
            min_abi=min_abi,
        ),
        pretend_abi=pretend,
    )
    seccomp.apply_filter()
    relay_socket, relay_port = policy.get("relay_socket"), policy.get("relay_port")
    if isinstance(relay_socket, str) and isinstance(relay_port, int):
        from lnk_controller.relay import start_relay

        localhost = policy.get("relay_localhost", [])
        ports = [p for p in localhost if isinstance(p, int)] if isinstance(localhost, list) else []
        start_relay(relay_socket, relay_port, ports)  # before the unix-socket block
    bridge_socket, bridge_port = policy.get("bridge_socket"), policy.get("bridge_port")
    if isinstance(bridge_socket, str) and isinstance(bridge_port, int):  # an agent's bridge
        from lnk_controller.relay import start_relay

        start_relay(bridge_socket, bridge_port)  # raw bytes, also before the block
    if policy.get("block_unix_sockets", True):
        seccomp.block_unix_sockets()


def main(argv: list[str]) -> int:
    policy_path = POLICY_PATH
    if len(argv) > 2 and argv[0] == "--policy":  # tests; inside a sandbox it is always bound
        policy_path, argv = argv[1], argv[2:]
    if len(argv) < 2 or argv[0] != "--":
        print("lnk-sandbox: usage: confiner [--policy FILE] -- PROGRAM [ARGS...]", file=sys.stderr)
        return EXIT_CONFINEMENT_FAILED
    target = argv[1:]
    try:
        os.closerange(3, os.sysconf("SC_OPEN_MAX"))
        confine(load_policy(policy_path))
    except (LaunchRefused, ValueError, UnicodeDecodeError) as exc:
        print(f"lnk-sandbox: not running {target[0]}: {exc}", file=sys.stderr)
        return EXIT_CONFINEMENT_FAILED
    try:
        os.execv(target[0], target)
    except OSError as exc:
        print(f"lnk-sandbox: cannot run {target[0]}: {exc.strerror}", file=sys.stderr)
        return EXIT_CONFINEMENT_FAILED if exc.errno != 2 else 127
    return EXIT_CONFINEMENT_FAILED  # pragma: no cover - execv does not return


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
