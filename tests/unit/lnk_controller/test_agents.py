"""The agents' registry: the controller makes each key pair, keeps the private key root-only
and out of every answer, registers an enrollable public key; names are per owner."""

from __future__ import annotations

import base64
import dataclasses
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    PublicFormat,
    load_pem_private_key,
)

from lnk_controller.agents import AgentRegistry, agent_id_of
from lnk_controller.db import open_database
from lnk_shared.errors import UsageError
from lnk_shared.proofs import enroll_public_key

OWNER, OTHER = 1001, 1002


@pytest.fixture
def registry(tmp_path: Path) -> Iterator[AgentRegistry]:
    engine = open_database(tmp_path / "db" / "controller.db")
    yield AgentRegistry(engine, tmp_path / "agent-keys")
    engine.dispose()


def test_create_makes_a_key_pair_whose_private_half_is_a_root_only_file(
    registry: AgentRegistry,
) -> None:
    agent = registry.create(OWNER, "helper", "/home/o/agent.toml")
    assert agent.agent_id == "u1001-helper" and not agent.running
    key_file = registry.key_file(agent.agent_id)
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    assert stat.S_IMODE(registry.key_dir.stat().st_mode) == 0o700
    private = load_pem_private_key(key_file.read_bytes(), password=None)
    public = private.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)  # type: ignore[union-attr]
    assert base64.b64decode(agent.public_key) == public
    enroll_public_key(public)


def test_no_answer_holds_the_private_key(registry: AgentRegistry) -> None:
    agent = registry.create(OWNER, "helper", "/s.toml")
    pem = registry.key_file(agent.agent_id).read_bytes()
    fields = {f.name for f in dataclasses.fields(agent)}
    assert not {"private_key", "key", "key_file"} & fields
    assert pem.decode() not in repr(registry.find(None))


def test_each_agent_gets_its_own_key(registry: AgentRegistry) -> None:
    keys = {registry.create(OWNER, f"a{i}", "/s.toml").public_key for i in range(3)}
    assert len(keys) == 3


def test_names_are_per_owner_and_unique(registry: AgentRegistry) -> None:
    registry.create(OWNER, "helper", "/s.toml")
    registry.create(OTHER, "helper", "/s.toml")
    with pytest.raises(UsageError, match="already have"):
        registry.create(OWNER, "helper", "/s.toml")
    assert [a.agent_id for a in registry.find(None)] == ["u1001-helper", "u1002-helper"]
    assert [a.owner_uid for a in registry.find(OTHER)] == [OTHER]
    # The refused duplicate did not replace the first one's key.
    assert registry.key_file(agent_id_of(OWNER, "helper")).exists()


@pytest.mark.parametrize("name", ["", "Helper", "../x", "a/b", "-a", "a" * 41, "a b"])
def test_a_bad_name_is_refused(registry: AgentRegistry, name: str) -> None:
    with pytest.raises(UsageError):
        registry.create(OWNER, name, "/s.toml")
    assert not registry.key_dir.exists() or not os.listdir(registry.key_dir)


def test_the_name_owner_is_reserved(registry: AgentRegistry) -> None:
    # Inbox messages from the owner read `from: owner`: an agent of that name would pass as it.
    with pytest.raises(UsageError, match="reserved"):
        registry.create(OWNER, "owner", "/s.toml")
    assert registry.find(OWNER) == []


def test_a_relative_spec_path_is_refused(registry: AgentRegistry) -> None:
    with pytest.raises(UsageError, match="absolute"):
        registry.create(OWNER, "helper", "agent.toml")


def test_remove_forgets_the_agent_and_deletes_its_key(registry: AgentRegistry) -> None:
    agent = registry.create(OWNER, "helper", "/s.toml")
    with pytest.raises(UsageError, match="no agent"):
        registry.remove(OTHER, "helper")  # not theirs
    registry.remove(OWNER, "helper")
    assert registry.find(None) == []
    assert not registry.key_file(agent.agent_id).exists()


def test_a_running_agent_cannot_be_removed(registry: AgentRegistry) -> None:
    agent = registry.create(OWNER, "helper", "/s.toml")
    registry.set_running(agent.agent_id, 200_001, "ab" * 32)
    running = registry.get(OWNER, "helper")
    assert running is not None and running.host_uid == 200_001 and running.spec_hash == "ab" * 32
    with pytest.raises(UsageError, match="running"):
        registry.remove(OWNER, "helper")
    registry.set_running(agent.agent_id, None)
    registry.remove(OWNER, "helper")
