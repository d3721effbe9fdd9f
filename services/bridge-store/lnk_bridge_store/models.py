"""The store bridge's tables. Every row belongs to one agent (its name is part of each key), so
no query can reach another agent's rows without naming that agent.

    events         append-only: (agent, conversation, seq) -> one JSON value, never updated
    conversations  the last seq of each conversation: the append's compare-and-set
    usage          bytes stored per agent, checked against the per-agent limit
    leases         one row per agent, kept after release so the fencing token only grows
    nonces         proofs' nonces until they expire: UNIQUE (agent, nonce) refuses a replay
    inbox          messages in (from the owner, schedules, other agents) until acknowledged
    open_agents    the agents whose sockets are open, opened again at start
"""

from __future__ import annotations

from sqlalchemy import BigInteger, Integer, LargeBinary, MetaData, String, Text
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

__all__ = ["Base", "Conversation", "Event", "InboxMessage", "Lease", "Nonce", "OpenAgent", "Usage"]

AGENT = 64
NAME = 128


class Base(DeclarativeBase):
    metadata = MetaData(
        naming_convention={
            "pk": "pk_%(table_name)s",
            "uq": "uq_%(table_name)s_%(column_0_N_name)s",
            "ix": "ix_%(table_name)s_%(column_0_N_name)s",
        }
    )


class Event(Base):
    __tablename__ = "events"
    agent: Mapped[str] = mapped_column(String(AGENT), primary_key=True)
    conversation: Mapped[str] = mapped_column(String(NAME), primary_key=True)
    seq: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    payload: Mapped[str] = mapped_column(Text)
    appended_at: Mapped[int] = mapped_column(BigInteger)


class Conversation(Base):
    __tablename__ = "conversations"
    agent: Mapped[str] = mapped_column(String(AGENT), primary_key=True)
    conversation: Mapped[str] = mapped_column(String(NAME), primary_key=True)
    last_seq: Mapped[int] = mapped_column(BigInteger)


class Usage(Base):
    __tablename__ = "usage"
    agent: Mapped[str] = mapped_column(String(AGENT), primary_key=True)
    bytes: Mapped[int] = mapped_column(BigInteger)


class Lease(Base):
    __tablename__ = "leases"
    agent: Mapped[str] = mapped_column(String(AGENT), primary_key=True)
    token: Mapped[int] = mapped_column(BigInteger)  # the last token given: the next is greater
    holder: Mapped[str | None] = mapped_column(String(NAME), nullable=True)  # None: released
    expires_at: Mapped[int] = mapped_column(BigInteger)  # unix ms


class Nonce(Base):
    __tablename__ = "nonces"
    agent: Mapped[str] = mapped_column(String(AGENT), primary_key=True)
    nonce: Mapped[bytes] = mapped_column(LargeBinary(16), primary_key=True)
    expires: Mapped[int] = mapped_column(BigInteger, index=True)


class InboxMessage(Base):
    __tablename__ = "inbox"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    agent: Mapped[str] = mapped_column(String(AGENT), index=True)
    sender: Mapped[str] = mapped_column(String(NAME))
    body: Mapped[str] = mapped_column(Text)
    sent_at: Mapped[int] = mapped_column(BigInteger)


class OpenAgent(Base):
    """An agent whose socket the controller opened and has not closed: opened again when the
    bridge starts, so a running agent's calls go on after a bridge restart."""

    __tablename__ = "open_agents"
    agent: Mapped[str] = mapped_column(String(AGENT), primary_key=True)
    public_key: Mapped[str] = mapped_column(String(64))
    host_uid: Mapped[int] = mapped_column(BigInteger)
