"""`lnk spec list`: a remembered spec's path is a name from disk, shown as escapes."""

from __future__ import annotations

import pytest

from lnk_cli import spec_commands

HOSTILE = "/home/u/x\x1b[2J\u202e\u200bspec.toml"


def test_list_shows_a_hostile_spec_path_as_escapes(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = [{"hash": "0" * 64, "approved_at": "2026-12-01T12:00:00", "spec": HOSTILE}]
    monkeypatch.setattr(spec_commands, "_api", lambda *_a: rows)

    class Args:
        json = False

    assert spec_commands.cmd_list(Args()) == 0  # type: ignore[arg-type]
    out = capsys.readouterr().out
    assert "/home/u/x\\x1b[2J\\u202e\\u200bspec.toml" in out
    assert out.splitlines()[0].split()[0] in ("NAME", "HASH")  # a header, then the row
    assert all(line.isprintable() for line in out.splitlines())


@pytest.mark.parametrize(
    ("grants", "said"),
    [
        ({"version": 1, "read": ["/srv/a"], "commands": ["/usr/bin/make"]}, "read /srv/a;"),
        ({"version": 1, "read": [], "commands": []}, "nothing but the program run"),
        ({"internet": "*", "network": None}, "internet *"),
        ({"read": [f"/r{n}" for n in range(6)]}, "read /r0, /r1, /r2, /r3 and 2 more"),
        ({"hidden": ["/x"], "read_only_inside": ["/y/.git"]}, "nothing but the program run"),
        ("not a document", ""),
        (None, ""),
    ],
)
def test_a_flag_approval_is_summed_up_by_what_it_opens(grants: object, said: str) -> None:
    assert said in spec_commands.grants_summary(grants)


def test_list_names_each_flag_approval_by_its_hash_and_what_it_opens(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    digest = "1a2b3c4d" * 8
    rows = [
        {
            "hash": digest,
            "approved_at": "2026-12-01T12:00:00",
            "spec": f"<flags>:{digest}",
            "grants": {"version": 1, "write": ["/home/u/out\x1b[2J"]},
        }
    ]
    monkeypatch.setattr(spec_commands, "_api", lambda *_a: rows)

    class Args:
        json = False

    assert spec_commands.cmd_list(Args()) == 0  # type: ignore[arg-type]
    out = capsys.readouterr().out
    assert f"<flags>:{digest[:16]}  write /home/u/out\\x1b[2J" in out
    assert digest not in out  # the key is cut to what `forget` needs


@pytest.mark.parametrize(("spec", "all_"), [(None, False), ("/s.toml", True)])
def test_forget_takes_a_spec_or_all_but_not_both(spec: str | None, all_: bool) -> None:
    from lnk_shared.errors import UsageError

    class Args:
        pass

    args = Args()
    args.spec, args.all = spec, all_  # type: ignore[attr-defined]
    with pytest.raises(UsageError, match="--all"):
        spec_commands.cmd_forget(args)  # type: ignore[arg-type]
