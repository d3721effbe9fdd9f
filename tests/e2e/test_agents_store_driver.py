"""`[store] driver` in a real box: an agent whose spec keeps its store with the driver the box's
store bridge runs starts and uses it; another driver, a URL, or a store in a plain sandbox is
refused before anything runs."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.needs_root]

PREFIX = Path(os.environ.get("LNK_PREFIX", "/opt/lnk"))
LNK = PREFIX / "venv" / "bin" / "lnk"


def _agent_with_spec(box: Any, text: str) -> str:
    owner = box.owner
    name = f"st-{os.urandom(2).hex()}"
    spec = owner.home / f"{name}.toml"
    spec.write_text(text)
    os.chown(spec, owner.uid, owner.gid)
    created = box.as_owner("agent", "create", name, "--spec", str(spec))
    assert created.returncode == 0, created.stderr
    return name


def _sandbox_users(box: Any) -> list[str]:
    homes = f"{box.state_dir}/homes/"
    with open("/etc/passwd", encoding="utf-8") as f:
        return [line for line in f if homes in line]


def test_an_agent_keeps_its_store_with_the_bridges_driver(running_box: Any) -> None:
    box = running_box
    name = _agent_with_spec(box, '[store]\ndriver = "sqlite"\n')
    try:
        lease = box.as_owner(
            "agent", "start", name, "--yes", "--", str(LNK), "bridge", "store", "lease",
            "acquire", "--holder", "h1", "--ttl", "30",
        )  # fmt: skip
        assert lease.returncode == 0, lease.stderr
        assert json.loads(lease.stdout)["token"] >= 1
    finally:
        box.as_owner("agent", "remove", name)


def test_another_driver_is_refused_before_anything_runs(running_box: Any) -> None:
    box = running_box
    name = _agent_with_spec(box, '[store]\ndriver = "postgresql"\n')
    try:
        before = _sandbox_users(box)
        started = box.as_owner("agent", "start", name, "--yes", "--", "/bin/true")
        assert started.returncode == 126, started.stderr  # refused: a run's status
        assert "'postgresql'" in started.stderr and "runs 'sqlite'" in started.stderr
        assert _sandbox_users(box) == before  # no user was made for it
    finally:
        box.as_owner("agent", "remove", name)


def test_a_url_as_the_driver_is_a_spec_error_naming_the_line(running_box: Any) -> None:
    box, owner = running_box, running_box.owner
    spec = owner.home / "store-url.toml"
    spec.write_text('[store]\ndriver = "sqlite:////var/lib/lnk/bridge-store/store.db"\n')
    os.chown(spec, owner.uid, owner.gid)
    shown = box.as_owner("spec", "show", "--spec", str(spec))
    assert shown.returncode == 2
    assert "store.driver" in shown.stderr and "name the driver only" in shown.stderr


def test_a_plain_sandbox_keeps_no_store(running_box: Any) -> None:
    ran = running_box.run("--store-driver=sqlite", cmd=["/bin/true"])
    assert ran.returncode == 126  # refused: a run's status
    assert "only an agent keeps a store" in ran.stderr


def test_spec_show_tells_the_store_and_its_hash_covers_it(running_box: Any) -> None:
    box, owner = running_box, running_box.owner
    spec = owner.home / "store-shown.toml"
    spec.write_text('[store]\ndriver = "sqlite"\n')
    os.chown(spec, owner.uid, owner.gid)
    shown = box.as_owner("spec", "show", "--spec", str(spec))
    assert shown.returncode == 0, shown.stderr
    assert "store" in shown.stdout and "sqlite" in shown.stdout
    as_json = box.as_owner("spec", "show", "--spec", str(spec), "--json")
    assert json.loads(as_json.stdout)["grants"]["store"] == "sqlite"
