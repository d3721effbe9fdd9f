"""The plan: what each spec's grants make of every probe, on real bait in a temp home. What the
sandbox is given never holds a secret."""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from lnk_cli.check.bait import Bait
from lnk_cli.check.plan import ALLOWED, KNOWN_GAP, REFUSED, Probe, build_plan
from lnk_shared.discovery import context_for, resolve_spec
from lnk_shared.grants import Grants
from lnk_shared.paths import PROJECT_RUN_DOT_ENTRIES, BoxPaths
from lnk_shared.refusals import judge
from lnk_shared.spec_flags import add_spec_arguments, spec_from_arguments

CONFINER_DIR = "/opt/lnk/venv/lib/python3.11/site-packages/lnk_controller"


@pytest.fixture
def home(tmp_path: Path) -> Path:
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "id_ed25519").write_text("KEY\n")
    (home / ".config").mkdir()
    (home / "project" / "out").mkdir(parents=True)
    (home / "project" / "out" / ".envrc").write_text("export X=1\n")
    return home


def grants_for(home: Path, *flags: str) -> Grants:
    parser = argparse.ArgumentParser()
    add_spec_arguments(parser)
    args = parser.parse_args(list(flags))
    spec = spec_from_arguments(args, cwd=str(home))
    box = BoxPaths(home.parent / "etc", home.parent / "state", home.parent / "run")
    ctx = context_for(os.getuid(), env={"PATH": "/usr/bin:/bin"}, box=box, home=str(home))
    return judge(resolve_spec(spec, ctx, path_env="/usr/bin:/bin"), ctx)


@pytest.fixture
def bait(home: Path) -> Iterator[Bait]:
    with Bait.set_up(str(home)) as made:
        yield made


def expected(probes: list[Probe]) -> dict[str, str]:
    return {p.id: p.expected for p in probes}


def test_with_no_grants_everything_is_expected_refused_the_loader_too(
    home: Path, bait: Bait
) -> None:
    probes = build_plan(grants_for(home), bait, CONFINER_DIR)
    others = {i: e for i, e in expected(probes).items() if e != REFUSED}
    assert others == {}
    assert "exec:loader" in expected(probes)
    ids = set(expected(probes))
    assert {"read.home", "read.settings", "read.var-tmp", "read.hidden:~/.ssh"} <= ids
    assert {"read.hidden:~/.config", "read.agents:Link/Agents", "list.ssh", "confiner"} <= ids
    assert not any(i.startswith("proxy:") for i in ids)  # no proxy in this sandbox


def test_no_secret_is_ever_in_what_the_sandbox_is_given(home: Path, bait: Bait) -> None:
    probes = build_plan(grants_for(home, f"--read={home}"), bait, CONFINER_DIR)
    plan = json.dumps([p.step for p in probes if p.step is not None])
    for secret in [f.secret for f in bait.files] + [bait.outside_secret]:
        assert secret not in plan
    assert all(p.step is None or p.step["id"] == p.id for p in probes)


def test_a_read_grant_of_the_home_allows_its_files_but_not_the_hidden_ones(
    home: Path, bait: Bait
) -> None:
    wanted = expected(build_plan(grants_for(home, f"--read={home}"), bait, CONFINER_DIR))
    assert wanted["read.home"] == ALLOWED
    assert wanted["read.hidden:~/.ssh"] == ALLOWED
    assert wanted["list.ssh"] == ALLOWED
    assert wanted["read.settings"] == REFUSED  # ~/.lnk is hidden inside any grant
    assert wanted["read.agents:Link/Agents"] == REFUSED
    assert wanted["write.home"] == REFUSED


def test_a_write_folder_must_take_a_write_and_keep_its_dot_entries(home: Path, bait: Bait) -> None:
    out = home / "project" / "out"
    probes = build_plan(grants_for(home, f"--write={out}"), bait, CONFINER_DIR)
    wanted = expected(probes)
    assert wanted[f"write.folder:{out}"] == ALLOWED
    assert wanted[f"write.deep-dot:{out}"] == KNOWN_GAP
    for entry in PROJECT_RUN_DOT_ENTRIES:
        assert wanted[f"write.dot:{out}/{entry}"] == REFUSED
    steps = {p.id: p.step for p in probes if p.step is not None}
    # An existing file is opened for writing (nothing written), a missing one created.
    assert steps[f"write.dot:{out}/.envrc"]["kind"] == "open_write"
    assert steps[f"write.dot:{out}/.git/hooks"]["kind"] == "create"
    assert steps[f"write.dot:{out}/.git/hooks"]["dirs"] == [f"{out}/.git", f"{out}/.git/hooks"]
    assert os.path.dirname(steps[f"write.dot:{out}/.git/hooks"]["path"]) == f"{out}/.git/hooks"
    assert steps[f"write.dot:{out}/.git/config"]["path"] == f"{out}/.git/config"
    leftovers = {p.id: p.leftovers for p in probes}
    assert leftovers[f"write.dot:{out}/.git/hooks"] == (f"{out}/.git",)
    assert wanted[f"exec:write-copy:{out}"] == REFUSED  # written there, never run from there
    (copy,) = leftovers[f"exec:write-copy:{out}"]
    assert os.path.dirname(copy) == str(out)


def test_host_network_expects_a_route_and_asks_no_proxy(home: Path, bait: Bait) -> None:
    wanted = expected(build_plan(grants_for(home, "--network-mode=host"), bait, CONFINER_DIR))
    assert wanted["internet:direct"] == ALLOWED
    assert wanted["server:127.0.0.1"] == REFUSED  # host mode does not grant this machine
    assert not any(i.startswith("proxy:") for i in wanted)


def test_behind_the_proxy_listed_hosts_are_allowed_and_the_rest_asked(
    home: Path, bait: Bait
) -> None:
    grants = grants_for(
        home,
        "--internet-host=www.example.com",
        "--internet-host=*.example.org",
        "--lan-host=10.1.2.3",
        "--lan-host=10.9.0.0/16",
        "--port=8080",
    )
    probes = build_plan(grants, bait, CONFINER_DIR)
    wanted = expected(probes)
    assert wanted["internet-host:www.example.com"] == ALLOWED
    assert wanted["lan-host:10.1.2.3"] == ALLOWED
    assert wanted["port:8080"] == KNOWN_GAP
    not_tried = {p.id for p in probes if p.step is None}
    assert not_tried == {"internet-host:*.example.org", "lan-host:10.9.0.0/16"}
    for ident in ("proxy:tunnel-1.1.1.1", "proxy:get-1.1.1.1", "proxy:mapped-1.1.1.1"):
        assert wanted[ident] == REFUSED
    machine = [i for i in wanted if i.startswith("proxy:machine:")]
    assert len(machine) >= 13 and {wanted[i] for i in machine} == {REFUSED}
    assert wanted["proxy:unlisted"] == REFUSED


def test_internet_star_is_never_asked_for_an_unlisted_host(home: Path, bait: Bait) -> None:
    probes = build_plan(grants_for(home, "--internet-host=*"), bait, CONFINER_DIR)
    unlisted = next(p for p in probes if p.id == "proxy:unlisted")
    assert (unlisted.step, unlisted.expected) == (None, ALLOWED)


def test_command_star_expects_every_exec_to_run(home: Path, bait: Bait) -> None:
    wanted = expected(build_plan(grants_for(home, "--command=*"), bait, CONFINER_DIR))
    execs = {i: e for i, e in wanted.items() if i.startswith("exec:")}
    assert execs == dict.fromkeys(
        ("exec:ungranted", "exec:loader", "exec:tmp-copy", "exec:memfd"), ALLOWED
    )


def test_the_ungranted_program_is_one_the_spec_does_not_grant(home: Path, bait: Bait) -> None:
    probes = build_plan(grants_for(home, "--command=basename"), bait, CONFINER_DIR)
    step = next(p.step for p in probes if p.id == "exec:ungranted")
    assert step is not None
    assert os.path.realpath(step["argv"][0]) != os.path.realpath("/usr/bin/basename")


def test_a_folder_passed_with_with_fd_is_probed_as_a_write_folder(
    home: Path, bait: Bait, tmp_path: Path
) -> None:
    passed = tmp_path / "passed"
    passed.mkdir()
    fd = os.open(passed, os.O_RDONLY | os.O_DIRECTORY)
    try:
        wanted = expected(build_plan(grants_for(home, f"--with-fd={fd}:write"), bait, CONFINER_DIR))
    finally:
        os.close(fd)
    assert wanted[f"write.folder:{passed}"] == ALLOWED
    assert wanted[f"write.dot:{passed}/.envrc"] == REFUSED


def test_a_folder_granted_for_reading_must_refuse_a_write(home: Path, bait: Bait) -> None:
    project, out = home / "project", home / "project" / "out"
    probes = build_plan(
        grants_for(home, f"--read={project}", f"--write={out}", f"--read={home}"),
        bait,
        CONFINER_DIR,
    )
    wanted = expected(probes)
    assert wanted[f"write.read-folder:{project}"] == REFUSED
    assert f"write.read-folder:{home}" not in wanted  # the home has its own probe
    assert f"write.read-folder:{out}" not in wanted  # written, not only read
    leftovers = {p.id: p.leftovers for p in probes}
    (made,) = leftovers[f"write.read-folder:{project}"]
    assert os.path.dirname(made) == str(project)


def test_every_granted_folder_is_probed_for_the_object_judged(home: Path, bait: Bait) -> None:
    grants = grants_for(home, f"--read={home / '.config'}", f"--write={home / 'project/out'}")
    probes = {p.id: p for p in build_plan(grants, bait, CONFINER_DIR)}
    found = {p.step["path"]: p for p in probes.values() if p.id.startswith("identity-") and p.step}
    assert set(found) == {str(home / ".config"), str(home / "project/out")}
    info = os.stat(home / "project/out")
    (evidence,) = found[str(home / "project/out")].evidence
    assert evidence.value == [info.st_dev, info.st_ino, 0o040000]
    assert all(p.expected == REFUSED for p in found.values())


def test_a_write_folder_gets_a_placeholder_probe_for_the_names_missing_outside(
    home: Path, bait: Bait
) -> None:
    out = home / "project" / "out"
    (out / ".envrc").write_text("")
    probes = build_plan(grants_for(home, f"--write={out}"), bait, CONFINER_DIR)
    steps = {p.id: p.step for p in probes if p.step is not None}
    step = steps[f"placeholder.git:{out}"]
    assert step["kind"] == "git_visible" and step["path"] == str(out)
    assert ".vscode" in step["names"] and ".envrc" not in step["names"]
    assert probes[0].id == f"placeholder.git:{out}"  # before any probe writes there


def test_the_other_user_probes_run_last_and_hold_the_sandbox(home: Path, bait: Bait) -> None:
    probes = build_plan(grants_for(home), bait, CONFINER_DIR)
    assert [p.id for p in probes[-2:]] == ["staging.other-users", "cmdline.other-users"]
    assert all(p.step is not None and p.step["kind"] == "hold" for p in probes[-2:])
    assert all(p.expected == REFUSED for p in probes[-2:])


def test_addresses_the_kernel_routes_here_are_asked_even_when_lan_lists_them(
    home: Path, bait: Bait
) -> None:
    bait.local_routed = ["10.61.0.2", "fd62::2"]  # a prefix on lo, an IPv6 local route
    for flags in ((), ("--lan-host=10.61.0.0/24", "--lan-host=fd62::/64")):
        grants = grants_for(home, "--internet-host=www.example.com", *flags)
        probes = {p.id: p for p in build_plan(grants, bait, CONFINER_DIR)}
        port = bait.server.port if bait.server else 0
        for target in (f"10.61.0.2:{port}", f"[fd62::2]:{port}"):
            probe = probes[f"proxy:local-route:{target}"]
            assert probe.expected == REFUSED
            assert probe.step is not None
            assert (probe.step["method"], probe.step["target"]) == ("CONNECT", target)
