"""`lnk sandbox enter`'s plan: the key line's arguments checked, the box pinned by --run-dir
(never the environment), the gate's own rules on the spec, the environment an allowlist."""

from __future__ import annotations

import os
import secrets
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from lnk_shared.errors import CommandRefused
from lnk_ssh_gate.enter import KeyAccountRefused, SessionWriteRefused, check_text, plan_session
from lnk_ssh_gate.gate_paths import GatePathRefused, UnsafeFolderRefused

pytestmark = pytest.mark.needs_root  # root-owned folders for the spec, as a box has

RUN_DIR = "/run"  # root's all the way up on any machine; the plan only checks it


@pytest.fixture
def place(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    """A spec in a root-owned folder (as the gate wants), and a session folder."""
    folder = tmp_path / "work"
    folder.mkdir()
    specs = Path(f"/run/lnk-unit-enter-{secrets.token_hex(4)}")
    specs.mkdir(mode=0o755)
    spec = specs / "gate.toml"
    spec.write_text('[commands]\nallow = ["/bin/bash", "id"]\n')
    try:
        yield spec, folder
    finally:
        shutil.rmtree(specs, ignore_errors=True)


def test_a_spec_others_than_root_could_rewrite_is_refused(place: tuple[Path, Path]) -> None:
    spec, folder = place
    in_tmp = folder.parent / "gate.toml"  # under /tmp, which anyone may write
    in_tmp.write_text(spec.read_text())
    with pytest.raises(UnsafeFolderRefused, match="the spec"):
        _plan(in_tmp, folder, {})
    os.chown(spec, 65534, 65534)
    with pytest.raises(UnsafeFolderRefused, match="not root"):
        _plan(spec, folder, {})


def _my_account() -> str:
    from lnk_shared.accounts import home_token, prove_account

    proof = prove_account(os.getuid())
    assert proof is not None
    return home_token(os.getuid(), proof)


def _plan(spec: Path, folder: Path, environ: dict[str, str], run_dir: str | None = RUN_DIR):
    """A session of a line as `lnk box authorize` writes it: bound to this account."""
    return plan_session(
        spec=str(spec),
        folder=str(folder),
        run_dir=run_dir,
        untrusted_environ=environ,
        account=_my_account(),
    )


def test_a_line_without_an_account_is_refused_naming_what_root_does(
    place: tuple[Path, Path],
) -> None:
    """A line written before lines were bound: a user given its uid later would inherit it."""
    spec, folder = place
    with pytest.raises(KeyAccountRefused, match=r"no --account.*lnk box authorize --bind"):
        plan_session(spec=str(spec), folder=str(folder), run_dir=RUN_DIR, untrusted_environ={})


def test_a_command_is_planned_with_only_the_allowed_environment(place: tuple[Path, Path]) -> None:
    spec, folder = place
    plan = _plan(
        spec,
        folder,
        {
            "SSH_ORIGINAL_COMMAND": "id -u",
            "SSH_AUTH_SOCK": "/tmp/ssh-x/agent.1",
            "LNK_RUN_DIR": "/home/u/fake-box",
            "PATH": "/home/u/bin",
            "TERM": "xterm",
            "LANG": "C.UTF-8",
        },
    )
    assert plan.command.argv == ("/bin/bash", "-c", "id -u")
    assert plan.env == {
        "TERM": "xterm",
        "LANG": "C.UTF-8",
        "PATH": plan.env["PATH"],
        "LNK_RUN_DIR": RUN_DIR,
    }
    assert plan.env["PATH"] == "/usr/local/bin:/usr/bin:/bin"
    assert plan.args.write == [str(folder)] and plan.args.yes is True
    assert f"a session writes only: {folder}" in check_text(plan)


def test_the_box_defaults_to_run_lnk_whatever_the_environment_says(
    place: tuple[Path, Path],
) -> None:
    spec, folder = place
    try:
        plan = _plan(spec, folder, {"LNK_RUN_DIR": str(folder)}, run_dir=None)
    except UnsafeFolderRefused as exc:  # a machine with no system box: /run/lnk is missing
        assert "/run/lnk" in str(exc)
    else:
        assert str(plan.run_dir) == "/run/lnk"
        assert plan.env["LNK_RUN_DIR"] == "/run/lnk"


def test_a_run_dir_others_could_change_is_refused(place: tuple[Path, Path], tmp_path: Path) -> None:
    spec, folder = place
    with pytest.raises(UnsafeFolderRefused):
        _plan(spec, folder, {}, run_dir=str(tmp_path))


def test_a_relative_folder_on_the_line_is_refused(place: tuple[Path, Path]) -> None:
    spec, _ = place
    with pytest.raises(GatePathRefused, match="absolute"):
        plan_session(spec=str(spec), folder="work", run_dir=RUN_DIR, untrusted_environ={})


def test_a_spec_that_does_not_let_bash_run_is_refused(place: tuple[Path, Path]) -> None:
    spec, folder = place
    spec.write_text('[commands]\nallow = ["id"]\n')
    with pytest.raises(CommandRefused, match="/bin/bash"):
        _plan(spec, folder, {})


def test_commands_star_lets_bash_run(place: tuple[Path, Path]) -> None:
    spec, folder = place
    spec.write_text('[commands]\nallow = ["*"]\n')
    assert _plan(spec, folder, {}).command.kind == "shell"


def test_a_spec_that_writes_elsewhere_is_refused(place: tuple[Path, Path], tmp_path: Path) -> None:
    spec, folder = place
    (tmp_path / "other").mkdir()
    spec.write_text(f'[folders]\nwrite = ["{tmp_path}/other"]\n[commands]\nallow = ["/bin/bash"]\n')
    with pytest.raises(SessionWriteRefused, match="writes only its folder"):
        _plan(spec, folder, {})


def test_a_key_line_for_this_account_plans_the_session(place: tuple[Path, Path]) -> None:
    spec, folder = place
    from lnk_shared.accounts import home_token, prove_account

    proof = prove_account(os.getuid())
    assert proof is not None
    token = home_token(os.getuid(), proof)
    plan = plan_session(
        spec=str(spec), folder=str(folder), run_dir=RUN_DIR, untrusted_environ={}, account=token
    )
    assert plan.folder == str(folder)


@pytest.mark.parametrize(
    "change",
    [
        lambda uid, dev, ino, gen: (uid + 1, dev, ino, gen),  # another uid of the same name
        lambda uid, dev, ino, gen: (uid, dev, ino + 1, gen),  # a home made anew elsewhere
        lambda uid, dev, ino, gen: (uid, dev + 1, ino, gen),  # a home on another disk
        lambda uid, dev, ino, gen: (uid, dev, ino, gen + 1),  # a home made anew in the inode
    ],
    ids=["uid", "inode", "device", "generation"],
)
def test_a_key_line_for_another_account_of_this_name_is_refused(
    place: tuple[Path, Path], change: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec, folder = place
    from lnk_shared.accounts import AccountProof
    from lnk_ssh_gate import enter

    now = AccountProof("alice", "/home/alice", 64768, 1192, 720500964)
    monkeypatch.setattr(enter, "prove_account", lambda _uid: now)
    uid, dev, ino, gen = change(os.getuid(), now.home_dev, now.home_ino, now.home_generation)
    with pytest.raises(KeyAccountRefused, match="another account of this name"):
        plan_session(
            spec=str(spec),
            folder=str(folder),
            run_dir=RUN_DIR,
            untrusted_environ={},
            account=f"{uid}:{dev}:{ino}:{gen}",
        )
    same = f"{os.getuid()}:{now.home_dev}:{now.home_ino}:{now.home_generation}"
    assert plan_session(
        spec=str(spec), folder=str(folder), run_dir=RUN_DIR, untrusted_environ={}, account=same
    )


@pytest.mark.parametrize("token", ["", "1:2:3", "0:0:0:0 --spec /etc/x", "x"])
def test_a_malformed_account_is_refused(place: tuple[Path, Path], token: str) -> None:
    spec, folder = place
    with pytest.raises(KeyAccountRefused, match="uid:device:inode:generation"):
        plan_session(
            spec=str(spec), folder=str(folder), run_dir=RUN_DIR, untrusted_environ={}, account=token
        )
