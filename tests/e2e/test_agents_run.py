"""Agents running in real sandboxes (`lnk agent start`): each has its own folder as its home,
its private key readable by it alone and never in its environment, and a store bridge socket
that serves only it. Two at once: A cannot read B's key, cannot reach B's socket, cannot act as
B; its own calls work; events survive a bridge restart; a stale fencing token is refused."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from contextlib import suppress
from pathlib import Path
from typing import Any

import pytest
from as_user import as_user

pytestmark = [pytest.mark.e2e, pytest.mark.needs_root]

PREFIX = Path(os.environ.get("LNK_PREFIX", "/opt/lnk"))
PYTHON = str(PREFIX / "venv" / "bin" / "python")
LNK = PREFIX / "venv" / "bin" / "lnk"

# Runs inside the agent's sandbox: each step of argv[1] (JSON) is a bridge call or a probe;
# one JSON answer per step on stdout.
INSIDE = r"""
import json, os, stat, sys
from pathlib import Path
from lnk_shared.proof_client import ProofSigner, bridge_address, call_bridge, load_private_key
PEM = "PRIVATE" + " KEY"  # not written whole: this script is itself in the argv
me = os.environ["LNK_AGENT"]
key = load_private_key(Path(os.environ["LNK_AGENT_KEY"]))
sock = bridge_address(os.environ["LNK_BRIDGE"])
out = []
for step in json.loads(sys.argv[1]):
    kind = step[0]
    try:
        if kind == "call":  # ["call", agent or null, action, args]
            signer = ProofSigner(step[1] or me, key, "inbox" if "inbox" in step[2] else "store")
            out.append(call_bridge(sock, signer, step[2], step[3]))
        elif kind == "read":  # ["read", path]
            out.append(Path(step[1]).read_text()[:30])
        elif kind == "self":
            info = Path(os.environ["LNK_AGENT_KEY"]).stat()
            out.append({
                "me": me, "uid": os.getuid(), "home": os.environ["HOME"], "cwd": os.getcwd(),
                "key_mode": oct(stat.S_IMODE(info.st_mode)), "key_uid": info.st_uid,
                "pem_in_env": any(PEM in v for v in os.environ.values()),
                "pem_in_argv": PEM in open("/proc/self/cmdline").read(),
            })
        elif kind == "write_home":
            Path(os.environ["HOME"], "note.txt").write_text("written by the agent\n")
            out.append("ok")
    except Exception as exc:
        out.append({"error": f"{type(exc).__name__}: {exc}"})
print(json.dumps(out))
"""


def owner_argv(box: Any, *args: str) -> list[str]:
    owner = box.owner
    return as_user(owner.uid, owner.gid, str(LNK), *args)


def inside(box: Any, name: str, steps: list[Any]) -> list[Any]:
    """Run the INSIDE script as agent `name`; its answers."""
    result = box.as_owner(
        "agent", "start", name, "--yes", "--", PYTHON, "-c", INSIDE, json.dumps(steps)
    )
    assert result.returncode == 0, result.stderr
    answers: list[Any] = json.loads(result.stdout.strip().splitlines()[-1])
    return answers


def create(box: Any, name: str) -> str:
    owner = box.owner
    spec = owner.home / "agent-spec.toml"
    if not spec.exists():
        spec.write_text("# an agent with no grants: its home, its key and its bridge only\n")
        os.chown(spec, owner.uid, owner.gid)
    result = box.as_owner("agent", "create", name, "--spec", str(spec))
    assert result.returncode == 0, result.stderr
    return f"u{owner.uid}-{name}"


def start_agent(box: Any, name: str, code: str) -> subprocess.Popen[str]:
    """`lnk agent start NAME --yes -- python -c CODE` as the owner, its output piped."""
    return subprocess.Popen(
        owner_argv(box, "agent", "start", name, "--yes", "--", PYTHON, "-c", code),
        env=box.owner_env(),
        cwd=str(box.owner.home),
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def wait_for(run: subprocess.Popen[str], marker: Path, timeout_s: float = 40) -> None:
    """Until the agent's program writes `marker` (it must still be running meanwhile)."""
    deadline = time.monotonic() + timeout_s
    while not marker.exists() and time.monotonic() < deadline:
        assert run.poll() is None, run.communicate()
        time.sleep(0.1)


def restart_bridge(box: Any) -> None:
    pid = int((box.run_dir / "bridge-store.pid").read_text())
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 15
    while Path(f"/proc/{pid}/cmdline").exists() and time.monotonic() < deadline:
        with suppress(OSError):
            if b"lnk_bridge_store" not in Path(f"/proc/{pid}/cmdline").read_bytes():
                break
        time.sleep(0.05)
    up = subprocess.run(
        [str(LNK), "box", "up"], env=box.env, capture_output=True, text=True, check=False
    )
    assert "bridge-store: up" in up.stdout, up.stdout + up.stderr


def test_two_agents_at_once_each_only_itself(running_box: Any) -> None:
    box = running_box
    tag = os.urandom(2).hex()
    a_name, b_name = f"a-{tag}", f"b-{tag}"
    a_id, b_id = create(box, a_name), create(box, b_name)
    b_run = subprocess.Popen(
        owner_argv(box, "agent", "start", b_name, "--yes", "--", "/bin/sleep", "60"),
        env=box.owner_env(),
        cwd=str(box.owner.home),
        text=True,
    )
    try:
        deadline = time.monotonic() + 30
        b_uid = None
        while b_uid is None and time.monotonic() < deadline:
            listed = json.loads(box.as_owner("agent", "list", "--json").stdout)
            b_uid = next((a["host_uid"] for a in listed if a["name"] == b_name), None)
            time.sleep(0.2)
        assert b_uid is not None, "agent B did not start"
        (b_entry,) = [a for a in listed if a["name"] == b_name]
        assert b_entry["running"] and len(b_entry["spec_hash"]) == 64  # what B runs with
        b_sandbox = next(
            s
            for s in json.loads(box.as_owner("sandbox", "list", "--json").stdout)
            if s.get("host_uid") == b_uid or "/bin/sleep" in s.get("command", [])
        )
        b_key_on_host = box.run_dir / "sandboxes" / b_sandbox["id"] / "agent" / "key.pem"
        b_socket_on_host = box.run_dir / "bridge-store" / "agents" / b_id / "bridge.sock"
        assert b_key_on_host.exists() and b_socket_on_host.exists()

        me, own_key, b_key, b_sock, as_b, lease, home = inside(
            box,
            a_name,
            [
                ["self"],
                ["read", "/run/lnk-agent/key.pem"],
                ["read", str(b_key_on_host)],
                ["read", str(b_socket_on_host)],
                ["call", b_id, "lease.acquire", {"holder": "a", "ttl_s": 60}],
                ["call", None, "lease.acquire", {"holder": "a", "ttl_s": 60}],
                ["write_home"],
            ],
        )
        assert me["me"] == a_id and me["uid"] != b_uid
        assert me["home"] == str(box.owner.home / "Link" / "Agents" / a_name) == me["cwd"]
        assert (me["key_mode"], me["key_uid"]) == ("0o400", me["uid"])
        assert not me["pem_in_env"] and not me["pem_in_argv"]
        assert own_key.startswith("-----BEGIN PRIVATE KEY")
        assert "error" in b_key and "error" in b_sock  # B's key and socket are not in A's world
        assert "refused the call" in as_b["error"]  # A's key, claiming B, on A's socket
        assert lease["token"] == 1 and home == "ok"
        note = box.owner.home / "Link" / "Agents" / a_name / "note.txt"
        assert note.read_text() == "written by the agent\n"
        assert note.stat().st_uid == box.owner.uid  # the owner's file, as any write grant's

        # B's lease was never taken by A: B's own first acquire is token 1 (B is busy
        # sleeping, so stop it first and ask as B).
        assert box.as_owner("agent", "stop", b_name).returncode == 0
        (b_lease,) = inside(
            box, b_name, [["call", None, "lease.acquire", {"holder": "b", "ttl_s": 5}]]
        )
        assert b_lease["token"] == 1
    finally:
        if b_run.poll() is None:
            b_run.kill()
        with suppress(subprocess.TimeoutExpired):
            b_run.communicate(timeout=20)
        for name in (a_name, b_name):
            box.as_owner("agent", "stop", name)
            box.as_owner("agent", "remove", name)
    listed = json.loads(box.as_owner("agent", "list", "--json").stdout)
    assert not [a for a in listed if a["name"] in (a_name, b_name)]


def test_events_survive_a_bridge_restart_and_a_stale_token_is_refused(running_box: Any) -> None:
    box = running_box
    name = f"c-{os.urandom(2).hex()}"
    create(box, name)
    try:
        lease, appended, renewed = inside(
            box,
            name,
            [
                ["call", None, "lease.acquire", {"holder": "h1", "ttl_s": 60}],
                [
                    "call",
                    None,
                    "append",
                    {"conversation": "c", "expected_seq": 0, "token": 1, "events": ["kept"]},
                ],
                ["call", None, "lease.renew", {"token": 1, "ttl_s": 1}],  # h1 then stalls
            ],
        )
        old = lease["token"]
        assert (old, appended, renewed["token"]) == (1, {"last_seq": 1}, 1)
        append = {"conversation": "c", "expected_seq": 1, "token": old, "events": ["late"]}
        restart_bridge(box)
        time.sleep(1.1)  # h1's lease (1 s) is over whatever happened: h2 may take it
        new, stale, page = inside(
            box,
            name,
            [
                ["call", None, "lease.acquire", {"holder": "h2", "ttl_s": 60}],
                ["call", None, "append", append],  # h1 wakes up with its old token
                ["call", None, "read", {"conversation": "c", "from_seq": 1, "limit": 10}],
            ],
        )
        assert new["token"] > old
        assert "fencing token" in stale["error"]
        assert page == {"events": [{"seq": 1, "event": "kept"}], "last_seq": 1}
    finally:
        box.as_owner("agent", "remove", name)


def test_a_message_sent_from_outside_is_read_inside_with_lnk_bridge(running_box: Any) -> None:
    box = running_box
    name = f"d-{os.urandom(2).hex()}"
    create(box, name)
    try:
        sent = box.as_owner("agent", "send", name, "please summarize the logs")
        assert sent.returncode == 0, sent.stderr
        read = box.as_owner(
            "agent", "start", name, "--yes", "--", str(LNK), "bridge", "inbox", "read"
        )
        assert read.returncode == 0, read.stderr
        (message,) = json.loads(read.stdout)["messages"]
        assert (message["from"], message["message"]) == ("owner", "please summarize the logs")
    finally:
        box.as_owner("agent", "remove", name)


# Inside: one call, a mark in the agent's home, a wait for the test's "go" (after it restarted
# the bridge), then a second call on the same relay.
ACROSS_RESTART = r"""
import json, os, sys, time
from pathlib import Path
from lnk_shared.proof_client import ProofSigner, bridge_address, call_bridge, load_private_key
me, home = os.environ["LNK_AGENT"], Path(os.environ["HOME"])
key = load_private_key(Path(os.environ["LNK_AGENT_KEY"]))
bridge = bridge_address(os.environ["LNK_BRIDGE"])
signer = ProofSigner(me, key, "inbox")
out = [call_bridge(bridge, signer, "inbox.read", {"after_id": 0, "limit": 5})]
(home / "first-call-done").write_text("")
deadline = time.monotonic() + 40
while not (home / "go").exists() and time.monotonic() < deadline:
    time.sleep(0.1)
try:
    out.append(call_bridge(bridge, signer, "inbox.read", {"after_id": 0, "limit": 5}))
except Exception as exc:
    out.append({"error": str(exc)})
print(json.dumps(out))
"""


def test_a_running_agent_reaches_its_bridge_again_after_the_bridge_restarts(
    running_box: Any,
) -> None:
    box = running_box
    name = f"e-{os.urandom(2).hex()}"
    create(box, name)
    home = box.owner.home / "Link" / "Agents" / name
    run = start_agent(box, name, ACROSS_RESTART)
    try:
        wait_for(run, home / "first-call-done")
        restart_bridge(box)
        sent = box.as_owner("agent", "send", name, "after the restart")
        assert sent.returncode == 0, sent.stderr
        (home / "go").write_text("")
        out, err = run.communicate(timeout=60)
        assert run.returncode == 0, err
        first, second = json.loads(out.strip().splitlines()[-1])
        assert first == {"messages": []}
        assert [m["message"] for m in second["messages"]] == ["after the restart"]
    finally:
        if run.poll() is None:
            run.kill()
            run.communicate(timeout=20)
        box.as_owner("agent", "stop", name)
        box.as_owner("agent", "remove", name)


# Inside agent B: say it is up, wait for the test's "go" (after A sent), then read its inbox
# with `lnk bridge inbox read`, run in this process (the `lnk` script's own main): the sandbox
# lets only its first command be executed.
READ_WHEN_TOLD = r"""
import os, sys, time
from pathlib import Path
from lnk_cli.__main__ import main
home = Path(os.environ["HOME"])
(home / "ready").write_text("")
deadline = time.monotonic() + 40
while not (home / "go").exists() and time.monotonic() < deadline:
    time.sleep(0.1)
sys.argv = ["lnk", "bridge", "inbox", "read"]
sys.exit(main())
"""


def test_an_agent_sends_to_another_running_agent_of_its_owner(running_box: Any) -> None:
    box = running_box
    tag = os.urandom(2).hex()
    a_name, b_name = f"sa-{tag}", f"sb-{tag}"
    create(box, a_name)
    create(box, b_name)
    b_home = box.owner.home / "Link" / "Agents" / b_name

    def a_sends(to: str, message: str) -> subprocess.CompletedProcess[str]:
        argv = ("bridge", "inbox", "send", to, message)
        result: subprocess.CompletedProcess[str] = box.as_owner(
            "agent", "start", a_name, "--yes", "--", str(LNK), *argv
        )
        return result

    stopped = a_sends(b_name, "too early")  # B is not running yet: refused, nothing queued
    assert stopped.returncode != 0 and "not running" in stopped.stderr, stopped.stderr
    b_run = start_agent(box, b_name, READ_WHEN_TOLD)
    try:
        wait_for(b_run, b_home / "ready")
        sent = a_sends(b_name, "hi")
        assert sent.returncode == 0, sent.stderr
        assert json.loads(sent.stdout) == {"sent": True, "to": b_name}
        # Another owner's agent spelled as a full id names nothing of theirs: refused alike.
        other = a_sends(f"u{box.owner.uid + 1}-{b_name}", "hi")
        assert other.returncode != 0 and "not running" in other.stderr, other.stderr
        (b_home / "go").write_text("")
        out, err = b_run.communicate(timeout=60)
        assert b_run.returncode == 0, err
        (message,) = json.loads(out)["messages"]  # "too early" was never stored
        assert (message["from"], message["message"]) == (a_name, "hi")
    finally:
        if b_run.poll() is None:
            b_run.kill()
            b_run.communicate(timeout=20)
        for name in (a_name, b_name):
            box.as_owner("agent", "stop", name)
            box.as_owner("agent", "remove", name)
