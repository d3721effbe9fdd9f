"""An agent's launch: the request names the caller's agent by name only; the agent's folder must
be the owner's own, reached without links, looked at as the owner; a running agent is not started
twice. (The confiner's relay of the bridge: test_confiner.py.) The folder checks set this thread's
file credentials (`as_caller.py`): root only."""

from __future__ import annotations

import os
import pwd
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from lnk_controller import agent_launch
from lnk_controller.agent_launch import agent_for_launch
from lnk_controller.agents import AgentRegistry
from lnk_controller.as_caller import CallerCredentials
from lnk_controller.db import open_database
from lnk_controller.launch_request import parse_launch_request
from lnk_controller.sandbox_store import SandboxStore
from lnk_shared.errors import LaunchRefused, UsageError

OWNER = os.getuid()
ME = CallerCredentials(OWNER, os.getgid(), tuple(os.getgroups()))
NOBODY = CallerCredentials(65534, 65534, ())


def request(**changes: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "type": "launch",
        "argv": ["/bin/sh"],
        "cwd": "/",
        "fds": {"stdin": 0, "stdout": 1, "stderr": 2},
    }
    base.update(changes)
    return base


def test_a_launch_request_may_name_an_agent() -> None:
    assert parse_launch_request(request(agent="helper"), 3).agent == "helper"
    assert parse_launch_request(request(), 3).agent is None


@pytest.mark.parametrize(
    "changes",
    [
        {"agent": "../x"},
        {"agent": "Helper"},
        {"agent": 5},
        {"agent": "u1000-helper/../../b"},
        {"agent": "helper", "dry": True},
        {"agent": "helper", "check": True},
    ],
)
def test_a_bad_agent_in_a_launch_request_is_refused(changes: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="agent"):
        parse_launch_request(request(**changes), 3)


class Setup:
    def __init__(self, tmp_path: Path) -> None:
        self.engine = open_database(tmp_path / "db" / "controller.db")
        self.registry = AgentRegistry(self.engine, tmp_path / "keys")
        self.store = SandboxStore(self.engine)
        self.home = tmp_path / "home"
        self.folder = self.home / "Link" / "Agents" / "helper"


@pytest.fixture
def setup(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Setup]:
    made = Setup(tmp_path)
    real = pwd.getpwuid(OWNER)
    fake = pwd.struct_passwd((*real[:5], str(made.home), *real[6:]))
    monkeypatch.setattr(agent_launch.pwd, "getpwuid", lambda uid: fake)
    made.registry.create(OWNER, "helper", "/spec.toml")
    yield made
    made.engine.dispose()


@pytest.mark.needs_root
def test_the_agents_own_folder_is_its_home(setup: Setup) -> None:
    setup.folder.mkdir(parents=True)
    launch = agent_for_launch(setup.registry, setup.store, ME, "helper")
    assert launch.home == str(setup.folder) and launch.agent.name == "helper"


def test_an_unknown_agent_is_refused(setup: Setup) -> None:
    with pytest.raises(UsageError, match="no agent named"):
        agent_for_launch(setup.registry, setup.store, ME, "other")
    with pytest.raises(UsageError, match="no agent named"):
        agent_for_launch(
            setup.registry, setup.store, CallerCredentials(OWNER + 1, 0, ()), "helper"
        )  # not theirs


@pytest.mark.needs_root
def test_a_missing_agent_folder_is_refused(setup: Setup) -> None:
    with pytest.raises(LaunchRefused, match="missing"):
        agent_for_launch(setup.registry, setup.store, ME, "helper")


@pytest.mark.needs_root
def test_an_agent_folder_that_is_a_link_is_refused(setup: Setup, tmp_path: Path) -> None:
    (tmp_path / "elsewhere").mkdir()
    setup.folder.parent.mkdir(parents=True)
    setup.folder.symlink_to(tmp_path / "elsewhere")
    with pytest.raises(LaunchRefused, match="without links"):
        agent_for_launch(setup.registry, setup.store, ME, "helper")


@pytest.mark.needs_root
def test_an_agent_folder_under_a_linked_parent_is_refused(setup: Setup, tmp_path: Path) -> None:
    (tmp_path / "elsewhere" / "helper").mkdir(parents=True)
    (setup.home / "Link").mkdir(parents=True)
    (setup.home / "Link" / "Agents").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(LaunchRefused, match="without links"):
        agent_for_launch(setup.registry, setup.store, ME, "helper")


@pytest.mark.needs_root
def test_an_agent_folder_of_someone_else_is_refused(setup: Setup) -> None:
    setup.folder.mkdir(parents=True)
    os.chown(setup.folder, OWNER + 4242, OWNER + 4242)
    with pytest.raises(LaunchRefused, match="folder of yours"):
        agent_for_launch(setup.registry, setup.store, ME, "helper")


@pytest.mark.needs_root
def test_a_link_above_the_owners_home_is_the_machines_and_allowed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    made = Setup(tmp_path)
    (tmp_path / "data" / "home" / "Link" / "Agents" / "helper").mkdir(parents=True)
    made.home.symlink_to(tmp_path / "data" / "home")  # /home -> /data/home, say
    real = pwd.getpwuid(OWNER)
    fake = pwd.struct_passwd((*real[:5], str(made.home), *real[6:]))
    monkeypatch.setattr(agent_launch.pwd, "getpwuid", lambda uid: fake)
    made.registry.create(OWNER, "helper", "/spec.toml")
    try:
        launch = agent_for_launch(made.registry, made.store, ME, "helper")
        assert launch.home == str(tmp_path / "data" / "home" / "Link" / "Agents" / "helper")
    finally:
        made.engine.dispose()


@pytest.mark.needs_root
@pytest.mark.parametrize("there", [True, False])
def test_a_link_into_a_folder_the_caller_cannot_search_answers_the_same(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, there: bool
) -> None:
    """The caller's ~/Link is its own link into root's 0700 folder: whether `Agents/helper` is
    there does not change the answer (root's lstat told), and the answer names no target."""
    made = Setup(tmp_path)
    base = Path(tempfile.mkdtemp(prefix="lnk-agent-"))  # outside pytest's 0700 folder
    base.chmod(0o755)
    made.home = base / "home"
    made.home.mkdir(mode=0o755)
    private = base / "private"
    private.mkdir(mode=0o700)
    if there:
        (private / "Agents" / "helper").mkdir(parents=True)
        os.chown(private / "Agents" / "helper", NOBODY.uid, NOBODY.gid)
    (made.home / "Link").symlink_to(private)
    real = pwd.getpwuid(OWNER)
    fake = pwd.struct_passwd((*real[:5], str(made.home), *real[6:]))
    monkeypatch.setattr(agent_launch.pwd, "getpwuid", lambda uid: fake)
    made.registry.create(NOBODY.uid, "helper", "/spec.toml")
    try:
        with pytest.raises(LaunchRefused) as refused:
            agent_for_launch(made.registry, made.store, NOBODY, "helper")
    finally:
        made.engine.dispose()
        shutil.rmtree(base)
    assert "without links" in str(refused.value)
    assert str(private) not in str(refused.value)
