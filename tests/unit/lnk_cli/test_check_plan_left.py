"""The plan for what a sandbox leaves or runs: what each spec's grants make of those probes."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from lnk_cli.check.plan import ALLOWED, REFUSED
from lnk_cli.check.plan_left import SET_ID, SHARED_WRITE, wall_probes
from lnk_shared.grants import Grants

GrantsFor = Callable[..., Grants]  # conftest.judged_flags: (home, *flags) -> the judged grants


@pytest.fixture
def home(tmp_path: Path) -> Path:
    home = tmp_path / "home"
    (home / "project" / "out").mkdir(parents=True)
    return home


def test_with_no_write_folder_only_dev_tmp_and_the_kernel_are_probed(
    home: Path, grants_for: GrantsFor
) -> None:
    probes = wall_probes(grants_for(home), "n0nce")
    ids = {p.id: p.expected for p in probes}
    assert ids == {
        "dev:write": REFUSED,
        "exec:preload:/dev": REFUSED,
        "exec:preload:/tmp": REFUSED,
        "kernel:memfd_secret": REFUSED,
        **({"kernel:modify_ldt": REFUSED} if os.uname().machine == "x86_64" else {}),
    }


def test_a_write_folder_gets_every_mode_probe_judged_outside(
    home: Path, grants_for: GrantsFor
) -> None:
    out = str(home / "project" / "out")
    probes = {p.id: p for p in wall_probes(grants_for(home, f"--write={out}"), "n0nce")}
    for kind, bits, judged in (
        ("set_id", SET_ID, "mode"),
        ("shared", SHARED_WRITE, "mode"),
        ("acl", SHARED_WRITE, "mode"),
        ("umask", SHARED_WRITE, "mode-swept"),
    ):
        probe = probes[f"mode:{kind}:{out}"]
        assert probe.expected == REFUSED
        assert probe.step is not None and probe.step["kind"] == kind
        (evidence,) = probe.evidence
        assert (evidence.kind, evidence.value) == (judged, bits)
        assert set(evidence.names) == set(probe.leftovers) == set(probe.step["paths"])
        assert all(os.path.dirname(p) == out for p in evidence.names)
    preload = probes[f"exec:preload:{out}"]
    assert preload.expected == REFUSED
    assert preload.step is not None and preload.leftovers == (preload.step["copy_to"],)


def test_command_star_lets_written_code_run_but_never_from_dev(
    home: Path, grants_for: GrantsFor
) -> None:
    out = str(home / "project" / "out")
    grants = grants_for(home, f"--write={out}", "--command=*")
    probes = {p.id: p.expected for p in wall_probes(grants, "n0nce")}
    assert probes["exec:preload:/dev"] == REFUSED
    assert probes["exec:preload:/tmp"] == ALLOWED
    assert probes[f"exec:preload:{out}"] == ALLOWED
    assert probes[f"mode:set_id:{out}"] == REFUSED


def test_host_network_tries_to_take_a_port(home: Path, grants_for: GrantsFor) -> None:
    probes = {p.id: p for p in wall_probes(grants_for(home, "--network-mode=host"), "n0nce")}
    listen = probes["host:listen"]
    assert listen.expected == REFUSED and listen.step is not None
    assert 20_000 <= listen.step["udp_port"] < 60_000
    assert "host:listen" not in {p.id for p in wall_probes(grants_for(home), "n0nce")}


@pytest.fixture
def tools(home: Path) -> Iterator[Path]:
    """A read folder for programs, outside /tmp (a program there is refused)."""
    path = Path(tempfile.mkdtemp(prefix="lnk-test-tools-", dir="/var/lib"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _program(path: Path, source: str = "/usr/bin/true") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(Path(source).read_bytes())
    path.chmod(0o755)
    return path


def test_a_read_grant_holding_a_granted_program_gets_the_loader_probe_on_its_neighbour(
    home: Path, grants_for: GrantsFor, tools: Path
) -> None:
    granted = _program(tools / "bin" / "granted")
    other = _program(tools / "bin" / "other", "/usr/bin/basename")
    (tools / "bin" / "a-script").write_text("#!/bin/sh\n")  # not ELF: not what the loader maps
    (tools / "bin" / "a-script").chmod(0o755)
    grants = grants_for(home, f"--read={tools}", f"--command={granted}")
    probes = {p.id: p for p in wall_probes(grants, "n0nce")}
    probe = probes[f"exec:loader-read:{tools}"]
    assert probe.expected == REFUSED
    assert probe.step is not None
    assert probe.step["argv"][1:] == ["--verify", str(other)]


def test_a_read_grant_without_a_granted_program_gets_no_loader_probe(
    home: Path, grants_for: GrantsFor, tools: Path
) -> None:
    _program(tools / "bin" / "other")
    probes = wall_probes(grants_for(home, f"--read={tools}"), "n0nce")
    assert not [p for p in probes if p.id.startswith("exec:loader-read:")]


def test_under_command_star_there_is_no_read_grant_loader_probe(
    home: Path, grants_for: GrantsFor, tools: Path
) -> None:
    # `allow = ["*"]` names no program (any runs): nothing is granted beside an ungranted one
    _program(tools / "bin" / "other")
    grants = grants_for(home, f"--read={tools}", "--command=*")
    probes = wall_probes(grants, "n0nce")
    assert not [p for p in probes if p.id.startswith("exec:loader-read:")]
