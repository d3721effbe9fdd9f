"""Host users: real /etc/passwd and /etc/group edits, real homes, as root: made and removed leaving
/etc byte for byte as it was, and every refusal (a uid taken, a foreign group, a planted
membership, an unsafe homes folder, a home that exists, is a link or holds a mount). Processes,
concurrency and the shared lock: test_host_users_processes.py.

Every uid comes from the `uids` fixture (a random block above 3_000_000_000) and is removed at
teardown, whatever the test did; teardown fails if a line or process of it is left
(conftest.py, tests/unit/helpers/host_user_kit.py).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from host_user_kit import (
    ETC_FILES,
    NewUid,
    assert_etc_as,
    etc_snapshot,
    lines_naming,
    without_others,
)

from lnk_controller import host_users
from lnk_controller.host_users import (
    HostUser,
    UidRange,
    check_range_is_free,
    create_user,
    ids_in_use,
    kill_uid_processes,
    list_lnk_users,
    remove_user,
    user_name,
)
from lnk_shared.errors import StateError

# --- create and remove ------------------------------------------------------------------------


@pytest.mark.needs_root
def test_create_then_remove_leaves_etc_byte_identical(uids: NewUid, homes: Path) -> None:
    before = etc_snapshot()
    modes = {p: os.stat(p) for p in ETC_FILES}
    user = create_user(uids(), homes_dir=homes)
    after_create = etc_snapshot()
    created = without_others(after_create, user.name, before)
    unchanged = without_others(before, user.name, after_create)
    assert created["/etc/shadow"] == unchanged["/etc/shadow"]  # no shadow line: '*' is enough
    assert created["/etc/gshadow"] == unchanged["/etc/gshadow"]
    for path, st in modes.items():
        now = os.stat(path)
        assert (now.st_mode, now.st_uid, now.st_gid) == (st.st_mode, st.st_uid, st.st_gid)
    remove_user(user)
    assert_etc_as(before, user.name)
    assert not (homes / user.name).exists()
    assert not [p for p in os.listdir("/etc") if p.endswith(".lnk-new")]


@pytest.mark.needs_root
def test_created_user_resolves_and_has_no_supplementary_groups(uids: NewUid, homes: Path) -> None:
    user = create_user(uids(), homes_dir=homes)
    u, name = user.uid, user.name
    passwd = subprocess.run(["getent", "passwd", name], capture_output=True, text=True, check=True)
    assert passwd.stdout == f"{name}:*:{u}:{u}::{homes}/{name}:/usr/sbin/nologin\n"
    group = subprocess.run(["getent", "group", name], capture_output=True, text=True, check=True)
    assert group.stdout == f"{name}:*:{u}:\n"
    groups = subprocess.run(["id", "-G", name], capture_output=True, text=True, check=True)
    assert groups.stdout.split() == [str(u)]
    assert (
        subprocess.run(["getent", "shadow", name], check=False, capture_output=True).returncode == 2
    )


@pytest.mark.needs_root
def test_home_is_private_and_owned_by_the_uid(uids: NewUid, homes: Path) -> None:
    user = create_user(uids(), homes_dir=homes)
    st = os.lstat(user.home)
    assert user.home == str(homes / user.name)
    assert (oct(st.st_mode), st.st_uid, st.st_gid) == (oct(0o40700), user.uid, user.gid)


@pytest.mark.needs_root
def test_removing_twice_is_fine(uids: NewUid, homes: Path) -> None:
    user = create_user(uids(), homes_dir=homes)
    remove_user(user)
    remove_user(user)
    assert not lines_naming(user.name)


@pytest.mark.needs_root
def test_listed_users_include_created_ones_and_group_only_leftovers(
    uids: NewUid, homes: Path
) -> None:
    user = create_user(uids(), homes_dir=homes)
    assert user in list_lnk_users()
    assert user.uid in ids_in_use()
    host_users._edit(host_users._without_user(user), (host_users.USERS_FILE,))  # crash mid-remove
    leftover = HostUser(user.name, user.uid, user.gid, "")
    assert leftover in list_lnk_users()
    remove_user(leftover)
    assert not lines_naming(user.name)


# --- refusals ---------------------------------------------------------------------------------


@pytest.mark.needs_root
def test_duplicate_uid_is_refused(uids: NewUid, homes: Path) -> None:
    user = create_user(uids(), homes_dir=homes)
    before = etc_snapshot()
    with pytest.raises(StateError, match=f"uid {user.uid} is taken by {user.name}"):
        create_user(user.uid, homes_dir=homes)
    assert_etc_as(before)


@pytest.mark.needs_root
def test_uid_of_a_foreign_group_is_refused(uids: NewUid, homes: Path) -> None:
    uid = uids()
    subprocess.run(["groupadd", "-g", str(uid), f"lnktest-{uid}"], check=True)
    try:
        assert check_range_is_free(UidRange(uid, uid)) != []
        before = etc_snapshot()
        with pytest.raises(StateError, match=f"uid {uid} is taken by lnktest-{uid} in /etc/group"):
            create_user(uid, homes_dir=homes)
        assert_etc_as(before)
        assert not (homes / user_name(uid)).exists()
    finally:
        subprocess.run(["groupdel", f"lnktest-{uid}"], check=True)


@pytest.mark.needs_root
def test_planted_group_membership_is_refused_not_inherited(uids: NewUid, homes: Path) -> None:
    """A group still naming a removed sandbox user would hand its next owner that group."""
    user = create_user(uids(), homes_dir=homes)
    group = f"lnktest-{user.uid}"
    subprocess.run(["groupadd", group], check=True)
    try:
        subprocess.run(["gpasswd", "-a", user.name, group], check=True, capture_output=True)
        remove_user(user)
        with pytest.raises(StateError, match=f"is taken by {group} in /etc/group"):
            create_user(user.uid, homes_dir=homes)
    finally:
        subprocess.run(["groupdel", group], check=True)


@pytest.mark.needs_root
def test_leftover_lnk_users_are_not_range_conflicts(uids: NewUid, homes: Path) -> None:
    user = create_user(uids(), homes_dir=homes)
    assert check_range_is_free(UidRange(user.uid, user.uid + 10)) == []


@pytest.mark.needs_root
@pytest.mark.parametrize("problem", ["link", "world-writable", "not-root-owned", "relative"])
def test_unsafe_homes_dir_is_refused(uids: NewUid, tmp_path: Path, problem: str) -> None:
    real = tmp_path / "real"
    real.mkdir(mode=0o711)
    homes = real
    if problem == "link":
        homes = tmp_path / "link"
        homes.symlink_to(real)
    elif problem == "world-writable":
        real.chmod(0o777)
    elif problem == "not-root-owned":
        os.chown(real, 65534, 65534)
    else:
        homes = Path("real")
    before = etc_snapshot()
    with pytest.raises(StateError, match="homes dir"):
        create_user(uids(), homes_dir=homes)
    assert_etc_as(before)


@pytest.mark.needs_root
def test_existing_home_is_refused_and_leaves_no_lines(uids: NewUid, homes: Path) -> None:
    uid = uids()
    (homes / user_name(uid)).mkdir()
    before = etc_snapshot()
    with pytest.raises(StateError, match="already exists"):
        create_user(uid, homes_dir=homes)
    assert_etc_as(before)
    (homes / user_name(uid)).rmdir()


@pytest.mark.needs_root
def test_home_replaced_by_link_to_etc_is_refused(uids: NewUid, homes: Path) -> None:
    user = create_user(uids(), homes_dir=homes)
    shutil.rmtree(user.home)
    Path(user.home).symlink_to("/etc")
    etc_before = sorted(os.listdir("/etc"))
    with pytest.raises(StateError, match="is a link"):
        remove_user(user)
    assert sorted(os.listdir("/etc")) == etc_before
    assert lines_naming(user.name)  # nothing removed: the person looks first


@pytest.mark.needs_root
def test_links_inside_home_are_removed_not_followed(
    uids: NewUid, homes: Path, tmp_path: Path
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "precious").write_text("keep")
    user = create_user(uids(), homes_dir=homes)
    (Path(user.home) / "dir").mkdir()
    (Path(user.home) / "dir" / "to-outside").symlink_to(outside)
    (Path(user.home) / "file-link").symlink_to(outside / "precious")
    os.link(outside / "precious", Path(user.home) / "hardlink")
    remove_user(user)
    assert (outside / "precious").read_text() == "keep"
    assert not Path(user.home).exists()


@pytest.mark.needs_root
def test_mount_under_home_is_refused(uids: NewUid, homes: Path) -> None:
    user = create_user(uids(), homes_dir=homes)
    mount_point = Path(user.home) / "mnt"
    mount_point.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "none", str(mount_point)], check=True)
    try:
        (mount_point / "data").write_text("on another filesystem")
        with pytest.raises(StateError, match="mounted"):
            remove_user(user)
        assert (mount_point / "data").exists()
    finally:
        subprocess.run(["umount", str(mount_point)], check=True)


@pytest.mark.parametrize("uid", [0, 1, 999, 65534])
def test_killing_root_or_system_uids_is_refused(uid: int) -> None:
    with pytest.raises(StateError, match="cannot be a sandbox's"):
        kill_uid_processes(uid)


# --- file edits, byte for byte ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("original", "expected"),
    [
        (b"a:x:1:\n", b"a:x:1:\nlnk-sbx-5000:*:5000:\n"),
        (b"a:x:1:", b"a:x:1:\nlnk-sbx-5000:*:5000:\n"),  # missing trailing newline
        (b"", b"lnk-sbx-5000:*:5000:\n"),
        (b"a:x:1:\n\nb:x:2:\n", b"a:x:1:\n\nb:x:2:\nlnk-sbx-5000:*:5000:\n"),
    ],
)
def test_adding_keeps_every_other_byte(
    original: bytes, expected: bytes, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(host_users, "_refuse_taken", lambda uid: None)  # not reading /etc
    add = host_users._with_user(HostUser("lnk-sbx-5000", 5000, 5000, "/h/lnk-sbx-5000"))
    assert add(host_users.GROUPS_FILE, original) == expected


@pytest.mark.parametrize(
    ("original", "expected"),
    [
        (b"a:x:1:\nlnk-sbx-5000:*:5000:\nb:x:2:\n", b"a:x:1:\nb:x:2:\n"),
        (b"a:x:1:\nlnk-sbx-5000:*:5000:", b"a:x:1:\n"),
        (b"lnk-sbx-5000:*:5000:\n", b""),
        (b"a:x:1:\n\xff\xfe:x:9:\n", b"a:x:1:\n\xff\xfe:x:9:\n"),  # nothing to remove: unchanged
        (b"a:x:1:\n\nlnk-sbx-50000:*:50000:\n", b"a:x:1:\n\nlnk-sbx-50000:*:50000:\n"),
    ],
)
def test_removing_keeps_every_other_byte(original: bytes, expected: bytes) -> None:
    drop = host_users._without_user(HostUser("lnk-sbx-5000", 5000, 5000, ""))
    assert drop(host_users.GROUPS_FILE, original) == expected


def test_removing_a_line_with_our_name_but_another_uid_is_refused() -> None:
    drop = host_users._without_user(HostUser("lnk-sbx-5000", 5000, 5000, ""))
    with pytest.raises(StateError, match="not for uid 5000"):
        drop(host_users.GROUPS_FILE, b"lnk-sbx-5000:*:0:\n")


def test_exports() -> None:
    assert sorted(host_users.__all__) == sorted(set(host_users.__all__))
    for name in host_users.__all__:
        assert hasattr(host_users, name), name
