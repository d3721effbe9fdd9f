"""The agents' part of the controller's API: create, list, remove an agent (with its store's
conversations and lease, unless kept), and send it a message. A caller acts on its own agents
only (the kernel says who calls: SO_PEERCRED); an agent of someone else is the same 404 as no
agent. No answer ever holds a private key.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from fastapi import FastAPI, HTTPException
from pydantic import BaseModel, ConfigDict, Field

from lnk_controller.agents import AgentPublic, AgentRegistry
from lnk_controller.api_caller import Caller
from lnk_controller.bridge_link import forget_agent, send_message
from lnk_controller.cleanup import clean_sandbox
from lnk_controller.config import ControllerConfig
from lnk_controller.sandbox_store import SandboxStore

__all__ = ["AgentCreate", "AgentMessage", "add_agent_routes"]

MAX_MESSAGE = 64 * 1024  # the bridge's own limit for a message in


class AgentCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(max_length=40)
    spec: str = Field(max_length=4096)


class AgentMessage(BaseModel):
    model_config = ConfigDict(extra="forbid")
    message: str = Field(max_length=MAX_MESSAGE)


def add_agent_routes(
    app: FastAPI, cfg: ControllerConfig, agents: AgentRegistry, store: SandboxStore
) -> None:
    def live(agent: AgentPublic) -> AgentPublic:
        """Running only while a live sandbox has its host uid (a sandbox a lease or a restart
        cleaned away leaves a stale uid in the registry)."""
        uids = {row.host_uid for row in store.find(live_only=True)}
        running = agent.host_uid is not None and agent.host_uid in uids
        return dataclasses.replace(
            agent, running=running, host_uid=agent.host_uid if running else None
        )

    def own(name: str, uid: int) -> AgentPublic:
        agent = agents.get(uid, name)
        if agent is None:
            raise HTTPException(status_code=404, detail=f"you have no agent named {name!r}")
        return live(agent)

    @app.post("/v1/agents")
    def create(body: AgentCreate, uid: Caller) -> AgentPublic:
        return agents.create(uid, body.name, body.spec)

    @app.get("/v1/agents")
    def listing(uid: Caller, all: bool = False) -> list[AgentPublic]:
        return [live(a) for a in agents.find(None if uid == 0 and all else uid)]

    @app.post("/v1/agents/{name}/stop")
    def stop(name: str, uid: Caller) -> AgentPublic:
        agent = own(name, uid)
        if agent.host_uid is None:  # stopped already: as stopping an ended sandbox, no error
            return agent
        for row in store.find(live_only=True):
            if row.host_uid == agent.host_uid and row.owner_uid == uid:
                clean_sandbox(row.id, store, cfg)
        agents.stopped(agent.host_uid)
        return own(name, uid)

    @app.delete("/v1/agents/{name}")
    def remove(name: str, uid: Caller, keep_store: bool = False) -> dict[str, Any]:
        """Forget the agent; unless `keep_store`, its conversations, inbox and lease first (a
        bridge that does not answer refuses the removal, so nothing is forgotten by halves)."""
        agent = own(name, uid)
        if agent.running:
            raise HTTPException(status_code=409, detail=f"agent {name!r} is running: stop it first")
        agents.stopped_if_set(uid, name)
        if not keep_store:
            forget_agent(cfg.run_dir, agent.agent_id)
        agents.remove(uid, name)
        return {"removed": name, "store": "kept" if keep_store else "removed"}

    @app.post("/v1/agents/{name}/send")
    def send(name: str, body: AgentMessage, uid: Caller) -> dict[str, Any]:
        agent = own(name, uid)
        sent = send_message(cfg.run_dir, agent.agent_id, "owner", body.message)
        return {"agent": name, "id": sent}
