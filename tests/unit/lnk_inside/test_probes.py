"""The probe program, outside any sandbox: each step reports "through" exactly when its attempt
worked, an error never ends the run, and it starts the way the controller starts it (`-I -S`,
the standard library only)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from lnk_inside.probes import MARKER_TIME, run_step

INSIDE_DIR = str(Path(__file__).resolve().parents[3] / "sandbox")
# How the controller starts it (lnk_controller.launch.PROBE_BOOT), with this checkout's path.
BOOT = (
    "import sys; sys.path.insert(0, sys.argv[1]); "
    "from lnk_inside.probes import main; sys.exit(main(sys.argv[2:]))"
)


def test_read_and_list_report_what_they_saw(tmp_path: Path) -> None:
    (tmp_path / "bait").write_text("secret\n")
    read = run_step({"id": "r", "kind": "read", "path": str(tmp_path / "bait")})
    assert (read["outcome"], read["data"]) == ("through", "secret\n")
    listed = run_step({"id": "l", "kind": "list", "path": str(tmp_path)})
    assert (listed["outcome"], listed["data"]) == ("through", ["bait"])
    missing = run_step({"id": "m", "kind": "read", "path": str(tmp_path / "none")})
    assert (missing["outcome"], missing["detail"]) == ("stopped", "ENOENT")


def test_a_link_is_never_followed_by_a_read(tmp_path: Path) -> None:
    (tmp_path / "real").write_text("x")
    (tmp_path / "link").symlink_to(tmp_path / "real")
    result = run_step({"id": "r", "kind": "read", "path": str(tmp_path / "link")})
    assert (result["outcome"], result["detail"]) == ("stopped", "ELOOP")


def test_create_makes_missing_folders_then_the_file_once(tmp_path: Path) -> None:
    step = {
        "id": "c",
        "kind": "create",
        "path": str(tmp_path / "a" / "b" / "f"),
        "dirs": [str(tmp_path / "a"), str(tmp_path / "a" / "b")],
        "content": "nonce",
    }
    assert run_step(step)["outcome"] == "through"
    assert (tmp_path / "a" / "b" / "f").read_text() == "nonce"
    again = run_step(step)
    assert (again["outcome"], again["detail"]) == ("stopped", "EEXIST")


def test_open_write_marks_the_mtime_and_changes_no_content(tmp_path: Path) -> None:
    path = tmp_path / ".envrc"
    path.write_text("export A=1\n")
    result = run_step({"id": "o", "kind": "open_write", "path": str(path)})
    assert result["outcome"] == "through"
    assert path.read_text() == "export A=1\n"
    assert path.stat().st_mtime_ns == MARKER_TIME * 1_000_000_000
    path.chmod(0o444)
    if os.geteuid() != 0:  # root writes a read-only file anyway
        assert run_step({"id": "o", "kind": "open_write", "path": str(path)})["detail"] == "EACCES"


def test_tcp_and_abstract_connect_and_say_who_they_are() -> None:
    with socket.socket() as server, socket.socket(socket.AF_UNIX) as unix:
        server.bind(("127.0.0.1", 0))
        server.listen(4)
        unix.bind("\0lnk-check-test-" + os.urandom(4).hex())
        unix.listen(4)
        port = server.getsockname()[1]
        assert run_step({"id": "t", "kind": "tcp", "host": "127.0.0.1", "port": port}) == {
            "outcome": "through",
            "detail": "connected",
            "data": "",
        }
        conn, _ = server.accept()
        with conn:
            assert conn.recv(100) == b"lnk-check t\n"
        name = unix.getsockname()[1:].decode()
        assert run_step({"id": "a", "kind": "abstract", "name": name})["outcome"] == "through"
    closed = run_step({"id": "t", "kind": "tcp", "host": "127.0.0.1", "port": port})
    assert (closed["outcome"], closed["detail"]) == ("stopped", "ECONNREFUSED")


@pytest.fixture
def proxy(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[bytes]]:
    """A stand-in proxy on loopback: refuses `refuse.example`, connects everything else."""
    heads: list[bytes] = []
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    server.settimeout(0.05)  # accept wakes up to see `done`: close alone does not wake it
    done = threading.Event()

    def serve() -> None:
        while not done.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                continue
            conn.settimeout(5)
            with conn:
                head = conn.recv(4096)
                heads.append(head)
                if b"refuse.example" in head:
                    body = b"lnk: refused (not-listed)\n"
                    conn.sendall(
                        b"HTTP/1.1 403 Forbidden\r\nContent-Length: %d\r\n\r\n%s"
                        % (len(body), body)
                    )
                else:
                    conn.sendall(b"HTTP/1.1 200 Connection Established\r\n\r\n")
                    heads.append(conn.recv(4096))

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{server.getsockname()[1]}")
    try:
        yield heads
    finally:
        done.set()
        thread.join(timeout=5)
        server.close()


def test_a_proxy_refusal_is_stopped_and_anything_else_got_through(proxy: list[bytes]) -> None:
    refused = run_step(
        {"id": "p", "kind": "proxy", "method": "CONNECT", "target": "refuse.example:443"}
    )
    assert refused["outcome"] == "stopped"
    assert refused["detail"] == "403 lnk: refused (not-listed)"
    through = run_step({"id": "q", "kind": "proxy", "method": "CONNECT", "target": "a.example:80"})
    assert (through["outcome"], through["data"]) == ("through", "200")
    assert proxy[0].startswith(b"CONNECT refuse.example:443 HTTP/1.1\r\n")
    deadline = time.monotonic() + 5  # the stand-in records the tunnel's bytes in its thread
    while b"lnk-check q\n" not in proxy and time.monotonic() < deadline:
        time.sleep(0.01)
    assert b"lnk-check q\n" in proxy  # the tunnel carried the probe's id to the target


def test_no_proxy_is_stopped_not_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HTTP_PROXY", raising=False)
    result = run_step({"id": "p", "kind": "proxy", "method": "GET", "target": "x:80"})
    assert result["outcome"] == "stopped"


def test_a_broken_step_is_an_error_never_a_refusal_and_never_a_crash() -> None:
    assert run_step({"id": "x", "kind": "read"})["outcome"] == "error"  # no path
    assert run_step({"id": "x", "kind": "nope"})["outcome"] == "error"


def test_exec_got_through_only_when_the_marker_came_back() -> None:
    ran = run_step(
        {"id": "e", "kind": "exec", "argv": ["/usr/bin/basename", "mark-1"], "marker": "mark-1"}
    )
    assert ran["outcome"] == "through"
    quiet = run_step({"id": "e", "kind": "exec", "argv": ["/bin/true", "m"], "marker": "m"})
    assert quiet["outcome"] == "stopped"


def test_the_program_starts_as_the_controller_starts_it_and_prints_one_document(
    tmp_path: Path,
) -> None:
    (tmp_path / "f").write_text("x")
    plan = [
        {"id": "one", "kind": "read", "path": str(tmp_path / "f")},
        {"id": "two", "kind": "list", "path": str(tmp_path / "missing")},
    ]
    result = subprocess.run(
        [sys.executable, "-I", "-S", "-c", BOOT, INSIDE_DIR, json.dumps(plan)],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    doc = json.loads(result.stdout)
    assert set(doc["results"]) == {"one", "two"}
    assert doc["results"]["one"]["outcome"] == "through"
    assert doc["results"]["two"]["outcome"] == "stopped"


def test_the_confiner_probe_destroys_nothing_even_when_it_gets_through(tmp_path: Path) -> None:
    folder = tmp_path / "site" / "lnk_controller"
    folder.mkdir(parents=True)
    (folder / "confiner.py").write_text("confine()\n")
    step = {
        "id": "c",
        "kind": "confiner",
        "dir": str(folder),
        "file": str(folder / "confiner.py"),
        "name": "lnk-check-x",
    }
    result = run_step(step)  # this folder is writable: everything gets through
    assert result["outcome"] == "through"
    assert "create a file in it" in result["detail"]
    assert sorted(os.listdir(folder)) == ["confiner.py"]
    assert sorted(os.listdir(folder.parent)) == ["lnk_controller"]
    assert (folder / "confiner.py").read_text() == "confine()\n"


def test_the_identity_step_reports_device_inode_and_type(tmp_path: Path) -> None:
    answer = run_step({"id": "i", "kind": "identity", "path": str(tmp_path)})
    info = os.stat(tmp_path)
    assert answer["outcome"] == "through"
    assert answer["data"] == [info.st_dev, info.st_ino, 0o040000]
    missing = run_step({"id": "i", "kind": "identity", "path": str(tmp_path / "no")})
    assert missing["outcome"] == "stopped"


def test_git_visible_reports_files_and_links_not_empty_folders(tmp_path: Path) -> None:
    (tmp_path / ".vscode").mkdir()  # an empty folder: git never lists it
    step = {"kind": "git_visible", "path": str(tmp_path), "names": [".vscode", ".envrc"]}
    assert run_step(step)["outcome"] == "stopped"
    (tmp_path / ".envrc").write_text("")
    answer = run_step(step)
    assert answer["outcome"] == "through" and answer["data"] == [".envrc"]
    (tmp_path / ".envrc").unlink()
    (tmp_path / ".envrc").symlink_to("/nonexistent")
    assert run_step(step)["data"] == [".envrc"]
    (tmp_path / ".vscode" / "tasks.json").write_text("{}")
    assert run_step(step)["data"] == [".vscode/", ".envrc"]


def test_hold_returns_once_its_stdin_is_closed() -> None:
    read_end, write_end = os.pipe()
    done = subprocess.Popen(
        [sys.executable, "-I", "-c", BOOT, INSIDE_DIR, json.dumps([{"id": "h", "kind": "hold"}])],
        stdin=read_end,
        stdout=subprocess.PIPE,
        text=True,
    )
    os.close(read_end)
    os.close(write_end)  # the outside has looked
    out, _ = done.communicate(timeout=30)
    assert json.loads(out)["results"]["h"]["detail"] == "held until the outside looked"


def test_limits_steps_go_through_below_a_limit() -> None:
    for what in ("processes", "open_files"):
        outcome = run_step({"kind": "limits", "what": what, "count": 16})
        assert outcome["outcome"] == "through", outcome


def test_an_oom_score_below_the_floor_goes_through() -> None:
    with open("/proc/self/oom_score_adj", encoding="ascii") as f:
        ours = int(f.read())
    outcome = run_step({"kind": "limits", "what": "oom_score", "count": ours + 1})
    assert outcome["outcome"] == "through", outcome
    assert f"is {ours}, below {ours + 1}" in outcome["detail"]


# In a child raised to 500 and dropped to an unprivileged uid (root may always lower it): the
# kernel refuses to go back down, as in a sandbox lnk-spawn started.
RAISED = """
import json, os, sys
sys.path.insert(0, sys.argv[1])
from lnk_inside.probes import run_step
with open("/proc/self/oom_score_adj", "w") as f:
    f.write("500")
os.setgroups([])
os.setresgid(65534, 65534, 65534)
os.setresuid(65534, 65534, 65534)
print(json.dumps(run_step({"kind": "limits", "what": "oom_score", "count": 500})))
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="raising and dropping needs root")
def test_an_oom_score_at_the_floor_that_cannot_be_lowered_is_stopped() -> None:
    result = subprocess.run(
        [sys.executable, "-I", "-S", "-c", RAISED, INSIDE_DIR],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    outcome = json.loads(result.stdout)
    assert outcome["outcome"] == "stopped", outcome
    assert "stands at 500" in outcome["detail"] and "EACCES" in outcome["detail"]


# In a child whose open-file limit is lowered (hard, so the probe cannot raise it): refused.
# (The processes step is refused in a sandbox: e2e test_limits; RLIMIT_NPROC spares root.)
LIMITED = """
import json, resource, sys
sys.path.insert(0, sys.argv[1])
resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
from lnk_inside.probes import run_step
print(json.dumps(run_step({"kind": "limits", "what": "open_files", "count": 4096})))
"""


def test_limits_steps_are_stopped_at_a_limit() -> None:
    result = subprocess.run(
        [sys.executable, "-I", "-S", "-c", LIMITED, INSIDE_DIR],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    files = json.loads(result.stdout)
    assert files["outcome"] == "stopped"
    assert "refused after" in files["detail"] and "EMFILE" in files["detail"]
