"""The box hardening: the drop-in as real sshd reads it (`sshd -t`, `sshd -T`), put in place
only when valid, idempotent; PAM's user_readenv turned off on a copy; never this machine's
/etc/ssh or /etc/pam.d."""

from __future__ import annotations

import secrets
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from lnk_shared.errors import StateError
from lnk_ssh_gate.sshd_dropin import (
    DROPIN_NAME,
    DropinPlaces,
    apply_pam_hardening,
    apply_sshd_dropin,
    harden_local_sshd,
    pam_without_user_readenv,
)

pytestmark = pytest.mark.needs_root

SSHD = "/usr/sbin/sshd"


@pytest.fixture
def places() -> Iterator[DropinPlaces]:
    root = Path(f"/run/lnk-unit-sshd-{secrets.token_hex(4)}")
    (root / "sshd_config.d").mkdir(parents=True, mode=0o755)
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd -t wants its privsep folder
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(root / "host")], check=True
    )
    main = root / "sshd_config"
    main.write_text(
        f"Include {root}/sshd_config.d/*.conf\nHostKey {root}/host\nUsePAM no\n"
        "X11Forwarding yes\nAllowTcpForwarding yes\nPermitTunnel yes\n"
    )
    try:
        yield DropinPlaces(
            main_config=main, dropin_dir=root / "sshd_config.d", keys_dir=root / "keys"
        )
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _effective(places: DropinPlaces, user: str, group: str) -> dict[str, str]:
    """`sshd -T` for a connection of `user` in `group`: what sshd would apply to it."""
    out = subprocess.run(
        [SSHD, "-T", "-f", str(places.main_config), "-C", f"user={user},host=h,addr=127.0.0.1"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return dict(line.split(" ", 1) for line in out.splitlines() if " " in line)


def test_the_dropin_is_applied_once_and_then_left_alone(places: DropinPlaces) -> None:
    assert apply_sshd_dropin(places) is True
    target = places.dropin_dir / DROPIN_NAME
    first = target.read_text()
    assert apply_sshd_dropin(places) is False
    assert target.read_text() == first
    assert target.stat().st_mode & 0o777 == 0o644


def test_users_outside_the_gates_group_keep_the_servers_settings(places: DropinPlaces) -> None:
    apply_sshd_dropin(places)  # Match Group lnk-gate: root is no member
    other = _effective(places, "root", "root")
    assert other["x11forwarding"] == "yes"  # the test config's own, untouched outside the Match
    assert other["disableforwarding"] == "no"
    assert other["permituserenvironment"] == "no"  # global: sshd allows it nowhere else


def test_a_dropin_for_members_of_root_applies_every_line(places: DropinPlaces) -> None:
    """The same function with the group `root`, so `sshd -T -C user=root` shows the Match."""
    rooted = DropinPlaces(places.main_config, places.dropin_dir, places.keys_dir, "root")
    apply_sshd_dropin(rooted)
    got = _effective(rooted, "root", "root")
    assert got["disableforwarding"] == "yes"
    assert got["permittunnel"] == "no"
    assert got["permituserrc"] == "no"
    assert got["authenticationmethods"] == "publickey"
    assert got["passwordauthentication"] == "no"
    assert got["authorizedkeysfile"] == f"{places.keys_dir}/%u"


def test_a_config_sshd_refuses_is_never_put_in_place(places: DropinPlaces) -> None:
    places.main_config.write_text(places.main_config.read_text() + "NoSuchKeyword yes\n")
    with pytest.raises(StateError, match="sshd refuses"):
        apply_sshd_dropin(places)
    assert not (places.dropin_dir / DROPIN_NAME).exists()


def test_a_main_config_without_the_include_is_refused(places: DropinPlaces) -> None:
    places.main_config.write_text("UsePAM no\n")
    with pytest.raises(StateError, match="does not Include"):
        apply_sshd_dropin(places)


DEBIAN_PAM = """\
session    required     pam_env.so # [1]
session    required     pam_env.so user_readenv=1 envfile=/etc/default/locale
# session  required     pam_env.so user_readenv=1
"""


def test_user_readenv_is_turned_off_on_active_pam_env_lines_only() -> None:
    assert pam_without_user_readenv(DEBIAN_PAM) == (
        "session    required     pam_env.so # [1]\n"
        "session    required     pam_env.so user_readenv=0 envfile=/etc/default/locale\n"
        "# session  required     pam_env.so user_readenv=1\n"
    )


def test_pam_hardening_on_a_copy_is_idempotent(tmp_path: Path) -> None:
    copy = tmp_path / "sshd"
    copy.write_text(DEBIAN_PAM)
    copy.chmod(0o644)
    assert apply_pam_hardening(copy) is True
    assert "user_readenv=1 envfile" not in copy.read_text()
    assert copy.stat().st_mode & 0o777 == 0o644
    assert apply_pam_hardening(copy) is False
    assert apply_pam_hardening(tmp_path / "missing") is False


def test_box_up_hardening_reports_what_it_did_then_nothing(
    places: DropinPlaces, tmp_path: Path
) -> None:
    pam = tmp_path / "sshd"
    pam.write_text(DEBIAN_PAM)
    first = harden_local_sshd(places, pam)
    assert len(first) == 2 and "reload sshd" in first[0] and "user_readenv" in first[1]
    assert harden_local_sshd(places, pam) == []


def test_box_up_hardening_reports_a_config_sshd_refuses_and_changes_nothing(
    places: DropinPlaces, tmp_path: Path
) -> None:
    places.main_config.write_text(places.main_config.read_text() + "NoSuchKeyword yes\n")
    (line,) = harden_local_sshd(places, tmp_path / "no-pam")
    assert line.startswith("NOT hardened")
    assert not (places.dropin_dir / DROPIN_NAME).exists()


def test_a_machine_without_an_sshd_config_is_left_alone(tmp_path: Path) -> None:
    nothing = DropinPlaces(tmp_path / "sshd_config", tmp_path / "d", tmp_path / "k")
    assert harden_local_sshd(nothing, tmp_path / "pam") == []
    assert list(tmp_path.iterdir()) == []
