"""The box hardening the gate relies on, as functions `lnk box up` and the Ansible role call:
an sshd drop-in with a `Match` block for box users, validated with `sshd -t` before it is used;
no `user_readenv=1` in sshd's PAM stack; box users' login shell `/bin/sh`.

Why each is needed (the gate is only a forced command: whatever sshd or the login does before
it runs is outside every sandbox):
- `AuthorizedKeysFile <dir>/%u`: the key lines (with their forced command) are root's; a file
  under the home could be rewritten by anything the user runs.
- `AuthenticationMethods publickey`: a password or keyboard-interactive login would have no
  forced command at all.
- `DisableForwarding yes`: no `-L`/`-R`/`-W`/`-D` TCP or unix-socket forwarding, no agent and
  no X11: each is a way from the client to this machine that does not pass the sandbox.
- `PermitTunnel no`: no `-w` tun/tap device, a network path around the sandbox.
- `PermitUserRC no`: `~/.ssh/rc` runs before the forced command, outside the sandbox.
- `PermitUserEnvironment no` (global: sshd refuses it inside `Match`): `~/.ssh/environment` or
  an `environment=` option could hand `LD_PRELOAD` or `PYTHONPATH` to the gate itself.
- PAM without `user_readenv=1`: pam_env would read `~/.pam_environment` into the gate's
  environment, the same hole by another door.
- login shell `/bin/sh`: sshd runs the forced command with `$SHELL -c`; bash, seeing it was
  started by sshd, reads `~/.bashrc` first (outside the sandbox), dash reads nothing.
`restrict` on every key line repeats the forwarding and rc refusals per key.

Security limitations: a `TrustedUserCAKeys` set globally still lets a certificate in without
the gate's line (sshd does not allow turning it off inside `Match`); the role must not set one.
"""

from __future__ import annotations

import contextlib
import grp
import os
import pwd
import re
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from lnk_shared.errors import StateError

__all__ = [
    "DROPIN_NAME",
    "GATE_GROUP",
    "GATE_SHELL",
    "DropinPlaces",
    "apply_pam_hardening",
    "apply_sshd_dropin",
    "dropin_text",
    "harden_local_sshd",
    "harden_user",
    "pam_without_user_readenv",
    "validate_sshd_config",
]

GATE_GROUP = "lnk-gate"  # box users: their only way in is a key with the gate's command
GATE_SHELL = "/bin/sh"  # dash on Debian: reads no rc file for `-c`
DROPIN_NAME = "50-lnk-gate.conf"
SSHD = "/usr/sbin/sshd"
PRIVSEP_DIR = Path("/run/sshd")
SSHD_CHECK_TIMEOUT_S = 30  # `sshd -t` reads the config and host keys; seconds at most
_USER_READENV = re.compile(r"\buser_readenv=1\b")


@dataclass(frozen=True)
class DropinPlaces:
    """Where a box's sshd reads its config: the main file (which must Include the drop-in
    folder), the drop-in folder, and the folder of root-owned key files."""

    main_config: Path = Path("/etc/ssh/sshd_config")
    dropin_dir: Path = Path("/etc/ssh/sshd_config.d")
    keys_dir: Path = Path("/etc/ssh/authorized_keys")
    group: str = GATE_GROUP


def dropin_text(places: DropinPlaces) -> str:
    return f"""\
# Written by lnk box (lnk_ssh_gate.sshd_dropin); changes here are overwritten.
# Members of {places.group} reach this box only through `lnk sandbox enter`, the forced
# command of their key's line in {places.keys_dir}/<user>. Why each line: see the module.
PermitUserEnvironment no
Match Group {places.group}
    AuthorizedKeysFile {places.keys_dir}/%u
    AuthorizedPrincipalsFile none
    AuthenticationMethods publickey
    PasswordAuthentication no
    KbdInteractiveAuthentication no
    DisableForwarding yes
    AllowAgentForwarding no
    AllowTcpForwarding no
    AllowStreamLocalForwarding no
    X11Forwarding no
    GatewayPorts no
    PermitListen none
    PermitOpen none
    PermitTunnel no
    PermitUserRC no
"""


def validate_sshd_config(main_config: Path, *, sshd: str = SSHD) -> None:
    """`sshd -t` on the config as sshd would read it; a refusal carries sshd's own words."""
    try:
        result = subprocess.run(
            [sshd, "-t", "-f", str(main_config)],
            capture_output=True,
            text=True,
            timeout=SSHD_CHECK_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise StateError(f"cannot run {sshd} -t to check {main_config}: {exc}") from None
    if result.returncode != 0:
        raise StateError(
            f"sshd refuses the config {main_config}: {result.stderr.strip() or result.stdout}"
        )


def _write_atomically(path: Path, text: str, mode: int = 0o644) -> None:
    fd, temp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            os.fchmod(f.fileno(), mode)
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temp)
        raise


def apply_sshd_dropin(places: DropinPlaces, *, sshd: str = SSHD) -> bool:
    """Install the drop-in if it is missing or different; True when it changed. The new text
    is checked with `sshd -t` (with the rest of the config) before it is put in place, and the
    whole config again after; a refusal puts the old file back. sshd itself must be reloaded
    by whoever runs it."""
    target = places.dropin_dir / DROPIN_NAME
    wanted = dropin_text(places)
    try:
        current: str | None = target.read_text(encoding="utf-8")
    except FileNotFoundError:
        current = None
    if current == wanted:
        return False
    if not places.main_config.is_file():
        raise StateError(f"no sshd config at {places.main_config}: is OpenSSH's server installed?")
    main_text = places.main_config.read_text(encoding="utf-8")
    if str(places.dropin_dir) not in main_text and "sshd_config.d" not in main_text:
        raise StateError(
            f"{places.main_config} does not Include {places.dropin_dir}/*.conf: "
            "the drop-in would be ignored"
        )
    places.dropin_dir.mkdir(mode=0o755, parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="lnk-sshd-check-") as scratch:
        candidate = Path(scratch) / DROPIN_NAME
        candidate.write_text(wanted, encoding="utf-8")
        trial = Path(scratch) / "sshd_config"
        # The drop-in first, as Debian's sshd_config includes its folder first (first value wins).
        trial.write_text(f"Include {candidate}\nInclude {places.main_config}\n", encoding="utf-8")
        validate_sshd_config(trial, sshd=sshd)
    _write_atomically(target, wanted)
    try:
        validate_sshd_config(places.main_config, sshd=sshd)
    except StateError:
        if current is None:
            target.unlink()
        else:
            _write_atomically(target, current)
        raise
    return True


def pam_without_user_readenv(text: str) -> str:
    """sshd's PAM stack with `user_readenv=1` turned off on every pam_env line."""
    out = []
    for line in text.splitlines(keepends=True):
        active = "pam_env.so" in line and not line.lstrip().startswith("#")
        out.append(_USER_READENV.sub("user_readenv=0", line) if active else line)
    return "".join(out)


def apply_pam_hardening(pam_file: Path = Path("/etc/pam.d/sshd")) -> bool:
    """Turn off `user_readenv=1` in `pam_file`; True when it changed (idempotent)."""
    try:
        text = pam_file.read_text(encoding="utf-8")
    except FileNotFoundError:
        return False  # no PAM stack for sshd: nothing reads ~/.pam_environment
    fixed = pam_without_user_readenv(text)
    if fixed == text:
        return False
    _write_atomically(pam_file, fixed, pam_file.stat().st_mode & 0o777)
    return True


def _ensure_group(group: str) -> None:
    try:
        grp.getgrnam(group)
    except KeyError:
        subprocess.run(["/usr/sbin/groupadd", "--system", group], check=True, capture_output=True)


def harden_user(user: str, group: str = GATE_GROUP) -> list[str]:
    """Make `user` a box user: login shell /bin/sh and a member of the gate's group (which the
    drop-in's Match names). Returns what changed, for the admin to read."""
    try:
        entry = pwd.getpwnam(user)
    except KeyError:
        raise StateError(f"there is no user {user!r} on this machine") from None
    if entry.pw_uid == 0:
        raise StateError("root is not a box user: the gate is for unprivileged users")
    changed = []
    _ensure_group(group)
    if entry.pw_shell != GATE_SHELL:
        subprocess.run(["/usr/sbin/usermod", "-s", GATE_SHELL, user], check=True)
        changed.append(f"{user}: login shell {entry.pw_shell} -> {GATE_SHELL}")
    if user not in grp.getgrnam(group).gr_mem:
        subprocess.run(["/usr/sbin/usermod", "-aG", group, user], check=True)
        changed.append(f"{user}: added to the group {group}")
    return changed


def harden_local_sshd(
    places: DropinPlaces | None = None,
    pam_file: Path = Path("/etc/pam.d/sshd"),
    *,
    sshd: str = SSHD,
) -> list[str]:
    """What `lnk box up` runs: the drop-in and the PAM change on this machine's sshd, if it has
    one. Returns lines for the admin. A config sshd refuses is left as it was and reported:
    without the drop-in sshd never reads the gate's key files, so the gate stays shut."""
    places = places or DropinPlaces()
    if not os.access(sshd, os.X_OK) or not places.main_config.is_file():
        return []  # no OpenSSH server here: nothing reaches the box over SSH
    done = []
    try:
        # sshd -t wants its privilege separation folder, which the ssh unit makes at its start.
        PRIVSEP_DIR.mkdir(mode=0o755, exist_ok=True)
        if apply_sshd_dropin(places, sshd=sshd):
            done.append(
                f"wrote {places.dropin_dir / DROPIN_NAME} (checked with sshd -t); "
                "reload sshd to apply it"
            )
    except (StateError, OSError) as exc:
        done.append(f"NOT hardened, keys let in through the gate will not work: {exc}")
    try:
        if apply_pam_hardening(pam_file):
            done.append(f"turned off user_readenv in {pam_file}")
    except OSError as exc:
        done.append(f"NOT hardened: cannot rewrite {pam_file}: {exc}")
    return done
