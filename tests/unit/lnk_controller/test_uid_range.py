"""The sandbox uid range, host user names and uid allocation: pure tables, no root needed."""

from __future__ import annotations

import pytest

from lnk_controller.uid_range import (
    HostUser,
    UidRange,
    allocate_uid,
    check_uid,
    range_conflicts,
    user_name,
)
from lnk_shared.errors import StateError

UID_MAX = 2**32 - 2


@pytest.mark.parametrize(
    ("first", "last"),
    [
        (0, 5000),  # root
        (1, 2000),
        (999, 2000),  # the last system id
        (5000, 4999),  # empty
        (60000, 70000),  # holds nobody (65534) and (uid16_t)-1
        (65534, 65534),
        (65535, 65600),
        (4_000_000_000, 2**32 - 1),  # (uid_t)-1
        (-5, 2000),
    ],
)
def test_unusable_ranges_are_refused(first: int, last: int) -> None:
    with pytest.raises(StateError, match="is unusable"):
        UidRange(first, last)


@pytest.mark.parametrize(
    ("first", "last"),
    [(1000, 1000), (1000, 65533), (65536, 70000), (3_000_000_000, UID_MAX)],
)
def test_usable_ranges(first: int, last: int) -> None:
    r = UidRange(first, last)
    assert first in r and last in r and first - 1 not in r and last + 1 not in r


@pytest.mark.parametrize("uid", [0, 1, 999, 65534, 65535, 2**32 - 1, 2**32, -1])
def test_root_system_and_special_uids_are_never_a_sandbox_uid(uid: int) -> None:
    with pytest.raises(StateError, match="cannot be a sandbox's"):
        check_uid(uid)


def test_user_names_are_short_and_valid_for_useradd() -> None:
    name = user_name(UID_MAX)
    assert name == "lnk-sbx-4294967294"
    assert len(name) <= 32
    assert name.replace("-", "").isalnum() and name.islower()


@pytest.mark.parametrize(
    ("name", "uid", "gid", "home"),
    [
        ("lnk-sbx-5000", 5001, 5001, ""),  # name and uid disagree
        ("lnk-sbx-5000", 5000, 100, ""),  # gid not the uid
        ("root", 0, 0, ""),
        ("lnk-sbx-0", 0, 0, ""),
        ("lnk-sbx-abc", -1, -1, ""),
        ("lnk-sbx-5000", 5000, 5000, "relative/lnk-sbx-5000"),
        ("lnk-sbx-5000", 5000, 5000, "/homes/someone-else"),
        ("lnk-sbx-5000", 5000, 5000, "/homes/../etc/lnk-sbx-5000"),
        ("lnk-sbx-5000", 5000, 5000, "/ho:mes/lnk-sbx-5000"),  # ':' would forge passwd fields
        ("lnk-sbx-5000", 5000, 5000, "/ho\nmes/lnk-sbx-5000"),
    ],
)
def test_host_users_lnk_box_did_not_make_are_refused(
    name: str, uid: int, gid: int, home: str
) -> None:
    with pytest.raises(StateError):
        HostUser(name, uid, gid, home)


def test_group_only_leftover_has_no_home() -> None:
    assert HostUser("lnk-sbx-5000", 5000, 5000, "").home == ""


@pytest.mark.parametrize(
    ("first", "last", "taken", "expected"),
    [
        (5000, 5010, set(), 5000),
        (5000, 5010, {5000, 5001, 5003}, 5002),
        (5000, 5010, {4999, 5011}, 5000),
        (5000, 5010, set(range(5000, 5010)), 5010),
        (5000, 5000, set(), 5000),
    ],
)
def test_allocate_gives_the_lowest_free_uid(
    first: int, last: int, taken: set[int], expected: int
) -> None:
    assert allocate_uid(UidRange(first, last), taken) == expected


@pytest.mark.parametrize("taken", [set(range(5000, 5011)), set(range(4000, 6000))])
def test_full_range_is_refused(taken: set[int]) -> None:
    with pytest.raises(StateError, match="no free uid in the range 5000-5010"):
        allocate_uid(UidRange(5000, 5010), taken)


def test_allocation_in_a_huge_range_is_quick() -> None:
    assert allocate_uid(UidRange(65536, UID_MAX), set(range(65536, 165_536))) == 165_536


@pytest.mark.parametrize(
    ("entries", "expected"),
    [
        ([], []),
        ([("/etc/passwd", "bob", 4999), ("/etc/passwd", "amy", 5011)], []),  # just outside
        (
            [("/etc/passwd", "bob", 5000)],
            ["/etc/passwd: bob has id 5000, inside the sandbox uid range 5000-5010"],
        ),
        ([("/etc/group", "lnk-sbx-5004", 5004)], []),  # our leftover: for reconcile
        (
            [("/etc/group", "lnk-sbx-5004", 5005)],  # our prefix, but not our name for the id
            ["/etc/group: lnk-sbx-5004 has id 5005, inside the sandbox uid range 5000-5010"],
        ),
        (
            [("/etc/passwd", "bob", 5010), ("/etc/passwd", "bob", 5010)],  # uid and gid: once
            ["/etc/passwd: bob has id 5010, inside the sandbox uid range 5000-5010"],
        ),
    ],
)
def test_range_conflicts(entries: list[tuple[str, str, int]], expected: list[str]) -> None:
    assert range_conflicts(UidRange(5000, 5010), entries) == expected


def test_exports() -> None:
    from lnk_controller import uid_range

    assert sorted(uid_range.__all__) == sorted(set(uid_range.__all__))
    for name in uid_range.__all__:
        assert hasattr(uid_range, name), name
