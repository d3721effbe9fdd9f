"""`lnk` inside an agent's sandbox: on its PATH under any `[commands]` list (the box grants its
client), shown as granted by the box, not writable, and nothing else ungranted runs beside it.
The client signs bridge calls itself (static C), so the box grants it alone: never an
interpreter (box_client.py).

Attacks: replace or shadow the box's `lnk` inside (its folder is the read-only root's); run an
ungranted program beside it (still refused by the loader guarantee); run Python code under a
list that names no Python, by name or through `lnk`'s fallback (refused: the box grants no
Python), while the bridge call itself works."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.needs_root]

PREFIX = Path(os.environ.get("LNK_PREFIX", "/opt/lnk"))
CLIENT = os.path.realpath(PREFIX / "venv" / "bin" / "lnk")

# Inside: the agent's shell, granted alone, runs `lnk` by name; then the box's own Python (the
# strongest tool it has: any syscall) tries to put another program in the box's `lnk`'s place,
# and the shell tries to write over it; last, an ungranted program.
REPLACE = (
    "import os\n"
    "try:\n"
    "    os.symlink('/bin/sh', '/run/lnk-box/bin/new')\n"
    "    os.replace('/run/lnk-box/bin/new', '/run/lnk-box/bin/lnk')\n"
    "    print('replace: done')\n"
    "except OSError as exc:\n"
    "    print('replace:', exc.strerror)\n"
)
SCRIPT = f"""
command -v lnk
lnk bridge inbox read
{PREFIX}/venv/bin/python3 -c "{REPLACE}"
(: > /run/lnk-box/bin/lnk) 2>/dev/null && echo "overwrite: done" || echo "overwrite: refused"
/usr/bin/id -u >/dev/null 2>&1; echo "ungranted: $?"
"""


@contextlib.contextmanager
def _an_agent(box: Any, spec_name: str, spec_text: str, prefix: str) -> Iterator[str]:
    """An agent of the box's owner made with this spec, removed (and its spec) at the end."""
    owner = box.owner
    spec = owner.home / spec_name
    spec.write_text(spec_text)
    os.chown(spec, owner.uid, owner.gid)
    name = f"{prefix}-{os.urandom(2).hex()}"
    try:  # a failed create leaves neither the agent nor its spec
        made = box.as_owner("agent", "create", name, "--spec", str(spec))
        assert made.returncode == 0, made.stderr
        yield name
    finally:
        box.as_owner("agent", "remove", name)
        spec.unlink()


@pytest.fixture(scope="module")
def agent(running_box: Any) -> Iterator[str]:
    text = '# a finite list: the shell and Python\n[commands]\nallow = ["/bin/sh", "python3"]\n'
    with _an_agent(running_box, "lnk-inside.toml", text, "li") as name:
        yield name


def test_an_agent_with_a_finite_list_calls_its_bridge_with_lnk_inside(
    running_box: Any, agent: str
) -> None:
    box = running_box
    sent = box.as_owner("agent", "send", agent, "hello from outside")
    assert sent.returncode == 0, sent.stderr
    run = box.as_owner("agent", "start", agent, "--yes", "--", "/bin/sh", "-c", SCRIPT)
    assert run.returncode == 0, run.stdout + run.stderr
    lines = run.stdout.splitlines()
    assert lines[0] == "/run/lnk-box/bin/lnk"  # on PATH, first, from the box
    end = next(i for i, line in enumerate(lines) if line.startswith("replace: "))
    (message,) = json.loads("\n".join(lines[1:end]))["messages"]  # printed as JSON
    assert message["message"] == "hello from outside"
    lines = [lines[0], lines[0], *lines[end:]]
    # The box's lnk cannot be replaced or written over (bwrap's read-only root, the prefix's
    # read-only bind); an ungranted program beside it is still refused.
    assert lines[2] == "replace: Read-only file system", lines[2]
    assert lines[3] == "overwrite: refused", lines[3]
    assert lines[4] == "ungranted: 126", lines[4]
    assert os.path.realpath(PREFIX / "venv" / "bin" / "lnk") == CLIENT  # nothing moved outside


def test_the_approval_and_spec_show_say_the_box_grants_lnk(running_box: Any, agent: str) -> None:
    box = running_box
    shown = box.as_owner("spec", "show", "--spec", str(box.owner.home / "lnk-inside.toml"))
    assert shown.returncode == 0, shown.stderr
    assert "lnk (granted by the box in an agent's sandbox" in shown.stdout, shown.stdout
    assert CLIENT in shown.stdout
    as_json = box.as_owner(
        "spec", "show", "--json", "--spec", str(box.owner.home / "lnk-inside.toml")
    )
    assert json.loads(as_json.stdout)["granted_by_the_box"]["agents"][0] == CLIENT
    forgot = box.as_owner("spec", "forget", str(box.owner.home / "lnk-inside.toml"))
    assert forgot.returncode == 0, forgot.stderr
    asked = box.as_owner("agent", "start", agent, "--", "/bin/sh", "-c", "true")
    assert asked.returncode != 0  # no terminal to answer on: refused, naming what it opens
    assert "lnk (granted by the box: its bridges' client" in asked.stderr, asked.stderr


def test_under_a_list_without_python_the_bridge_is_called_and_no_python_runs(
    running_box: Any,
) -> None:
    """`["/bin/sh"]` alone: the box grants its client (static C, which signs the call itself),
    never the interpreter behind it. The bridge call works; Python code does not run (126),
    whether named or reached through `lnk`'s fallback to its Python CLI (a form the C client
    leaves to argparse), which fails naming the forms it takes."""
    box = running_box
    owner = box.owner
    spec = owner.home / "lnk-inside-sh.toml"
    spec.write_text('# a finite list: the shell only\n[commands]\nallow = ["/bin/sh"]\n')
    os.chown(spec, owner.uid, owner.gid)
    name = f"ls-{os.urandom(2).hex()}"
    made = box.as_owner("agent", "create", name, "--spec", str(spec))
    assert made.returncode == 0, made.stderr
    python = PREFIX / "venv" / "bin" / "python3"
    script = (
        f"{python} -c 'print(6 * 7)' 2>/dev/null; echo \"python: $?\"; "
        'command -v lnk; lnk bridge inbox read; echo "lnk: $?"; '
        'lnk bridge inbox --help >/dev/null; echo "fallback: $?"'
    )
    try:
        sent = box.as_owner("agent", "send", name, "hello under a finite list")
        assert sent.returncode == 0, sent.stderr
        run = box.as_owner("agent", "start", name, "--yes", "--", "/bin/sh", "-c", script)
    finally:
        box.as_owner("agent", "remove", name)
        spec.unlink()
    assert run.returncode == 0, run.stdout + run.stderr
    lines = run.stdout.splitlines()
    assert lines[0] == "python: 126", run.stdout
    assert lines[1] == "/run/lnk-box/bin/lnk", run.stdout
    assert lines[-2:] == ["lnk: 0", "fallback: 2"], run.stdout
    (message,) = json.loads("\n".join(lines[2:-2]))["messages"]  # the C client's answer
    assert message["message"] == "hello under a finite list"
    assert "takes its plain forms only" in run.stderr, run.stderr  # Python was not run


def test_a_plain_sandbox_has_no_lnk_on_its_path(running_box: Any) -> None:
    run = running_box.run(
        "--command", "/bin/sh", cmd=["/bin/sh", "-c", "echo $PATH; command -v lnk || echo none"]
    )
    assert run.returncode == 0, run.stderr
    assert "/run/lnk-box" not in run.stdout


@pytest.fixture
def shell_only_agent(running_box: Any) -> Iterator[str]:
    """An agent whose spec grants `/bin/sh` alone, with one message waiting in its inbox."""
    text = '[commands]\nallow = ["/bin/sh"]\n'
    with _an_agent(running_box, "lnk-as-program.toml", text, "lp") as name:
        sent = running_box.as_owner("agent", "send", name, "for lnk itself")
        assert sent.returncode == 0, sent.stderr
        yield name


def test_lnk_as_the_program_brings_no_python_under_a_list_without_it(
    running_box: Any, shell_only_agent: str
) -> None:
    """`lnk` itself as the agent's program (`-- lnk bridge ...`), under `["/bin/sh"]`: the box
    grants its client alone here too, never the Python behind it (the controller used to add
    that Python whenever the program was the box's `lnk`). The bridge call works; the form the
    C client leaves to its Python CLI does not run Python."""
    start = ("agent", "start", shell_only_agent, "--yes", "--", "lnk", "bridge", "inbox")
    read = running_box.as_owner(*start, "read")
    assert read.returncode == 0, read.stdout + read.stderr
    (message,) = json.loads(read.stdout)["messages"]
    assert message["message"] == "for lnk itself"
    fallback = running_box.as_owner(*start, "--help")
    assert fallback.returncode == 2, fallback.stdout + fallback.stderr
    assert "takes its plain forms only" in fallback.stderr, fallback.stderr
    assert "usage:" not in fallback.stdout  # argparse's help: Python never ran
