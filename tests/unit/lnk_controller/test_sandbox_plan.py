"""`plan_sandbox`: the sandbox's environment, the confiner's policy and bwrap's layout, composed
from values alone. Table tests run as any user (no root, no mount, no file read): each case is a
launch's judged grants and staged paths, and what the plan must hold for it (the guarantees the
wall's e2e tests check from inside: tests/e2e/test_wall_*.py)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from lnk_controller.agent_launch import AGENT_DIR_INSIDE, BRIDGE_PORT, AgentLaunch
from lnk_controller.agents import AgentPublic
from lnk_controller.client_proxy_env import PROXY_NAMES
from lnk_controller.config import ControllerConfig
from lnk_controller.judged import Judged
from lnk_controller.launch_request import LaunchRequest, TerminalSize
from lnk_controller.proxy_link import PROXY_SOCKET_INSIDE
from lnk_controller.sandbox_plan import (
    NOTE_LIMIT,
    SANDBOX_PATH,
    Prepared,
    SandboxPlan,
    check_agent_network,
    cwd_note,
    plan_sandbox,
)
from lnk_controller.staging import Staged
from lnk_controller.uid_range import HostUser
from lnk_controller.wall import Bind
from lnk_shared.errors import EnvRefused, LaunchRefused
from lnk_shared.grants import Grants, ResolvedSpec
from lnk_shared.spec_models import ModelRule
from lnk_shared.spec_services import ServiceRule

UID = 2_000_000_007
USER = HostUser(f"lnk-sbx-{UID}", UID, UID, f"/var/lib/lnk/homes/lnk-sbx-{UID}")
HOME = f"/home/lnk-sbx-{UID}"  # the sandbox's home inside (SANDBOX_HOMES)
PREFIX = "/opt/lnk"
CFG = ControllerConfig(
    prefix=Path(PREFIX),
    python=Path(f"{PREFIX}/venv/bin/python"),
    confiner=Path(f"{PREFIX}/native/lnk-sandbox"),
)
STAGING = "/run/lnk/staging/sbx-1"
PROJECT, NOTES = "/home/owner/project", "/home/owner/notes"
GIT = "/usr/bin/git"
LOADER = "/usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2"
AGENT_HOME = "/home/owner/Link/Agents/a1"
BOT = ServiceRule("telegram", "api.telegram.org", "bot", ("getMe",))
MODEL = ModelRule(
    "openai", "https", "api.openai.com", 443, ("gpt-x",), "key", 8080, "OPENAI_BASE_URL"
)


def spec(**changes: Any) -> ResolvedSpec:
    nothing = ResolvedSpec(None, (), (), (), False, False, (), False, False, (), (), (), ())
    return dataclasses.replace(nothing, **changes)


def judged(agent: bool = False, env: dict[str, str] | None = None, **changes: Any) -> Judged:
    execute = (GIT, LOADER, *(["/"] if changes.get("commands_any") else []))
    launch = None
    if agent:
        public = AgentPublic("a1", "a1", 1000, "pk", "spec", "h", False, None, "now")
        launch = AgentLaunch(public, AGENT_HOME)
    return Judged(
        grants=Grants(spec(**changes), hidden=(), read_only_inside=()),
        digest="d",
        spec_key="k",
        program=GIT,
        execute=tuple(sorted(execute)),
        approval_lines=None,
        agent=launch,
        env=env or {},
    )


def request(cwd: str = PROJECT, env: dict[str, str] | None = None, **changes: Any) -> LaunchRequest:
    base = LaunchRequest(
        argv=("git", "status"),
        cwd=cwd,
        path_env="/usr/bin:/bin",
        flags=None,  # type: ignore[arg-type]  # read by the judging only
        env={"TERM": "xterm", "LANG": "C.UTF-8"} if env is None else env,
        terminal=None,
        yes=True,
        dry=False,
        stdio=(0, 1, 2),
        spec_fd=None,
        grant_fds={},
        with_fds={},
    )
    return dataclasses.replace(base, **changes)


def staged(*binds: Bind, usr: str | None = None) -> Staged:
    return Staged(
        binds=binds,
        read_only=(),
        tmp=f"{STAGING}/tmp",
        shm=f"{STAGING}/shm",
        home=f"{STAGING}/home",
        usr=usr,
    )


READ_AND_WRITE = (Bind(f"{STAGING}/g0", NOTES, False), Bind(f"{STAGING}/g1", PROJECT, True))


def plan(
    j: Judged | None = None,
    r: LaunchRequest | None = None,
    cfg: ControllerConfig = CFG,
    **prepared: Any,
) -> SandboxPlan:
    made = {"staged": staged(*READ_AND_WRITE), "owner_home": "/home/owner", **prepared}
    return plan_sandbox(
        cfg=cfg,
        judged=j or judged(),
        request=r or request(),
        sandbox_id="sbx-1",
        user=USER,
        prepared=Prepared(**made),
    )


def has_run(args: list[str], run: list[str]) -> bool:
    return any(args[i : i + len(run)] == run for i in range(len(args) - len(run) + 1))


def binds(p: SandboxPlan) -> dict[str, str]:
    """dest -> the bwrap option that mounts it (`--bind` writable, `--ro-bind` read-only)."""
    a = p.bwrap_args()
    return {a[i + 2]: a[i] for i, arg in enumerate(a) if arg in ("--bind", "--ro-bind")}


# -- only the allowed variables cross --------------------------------------------------------

IDENTITY = {"PATH", "HOME", "USER", "LOGNAME", "SHELL", "TMPDIR", "LNK_SANDBOX_ID"}


@pytest.mark.parametrize(
    ("j", "r", "prepared", "names"),
    [
        (judged(), request(), {}, IDENTITY | {"TERM", "LANG"}),
        (judged(), request(env={}), {}, IDENTITY),
        (judged(env={"MY_FLAG": "1"}), request(), {}, IDENTITY | {"TERM", "LANG", "MY_FLAG"}),
        (
            judged(internet_any=True),
            request(env={}),
            {"proxy_socket": f"{STAGING}/proxy.sock"},
            IDENTITY | set(PROXY_NAMES) | {"NO_PROXY", "no_proxy", "NODE_USE_ENV_PROXY"},
        ),
        (
            judged(services=(BOT,)),
            request(env={}),
            {"proxy_socket": f"{STAGING}/proxy.sock"},
            None,  # the proxy's names, and the secret's placeholder
        ),
    ],
)
def test_the_environment_is_the_box_layers_and_the_judged_names_only(
    monkeypatch: pytest.MonkeyPatch,
    j: Judged,
    r: LaunchRequest,
    prepared: dict[str, Any],
    names: set[str] | None,
) -> None:
    monkeypatch.setenv("LNK_PLAN_LEAK", "the controller's own")  # never crosses
    monkeypatch.setenv("LD_PRELOAD", "/tmp/x.so")
    env = plan(j, r, **prepared).env
    assert "LNK_PLAN_LEAK" not in env and "LD_PRELOAD" not in env
    if names is not None:
        allowed = names | {"JAVA_TOOL_OPTIONS", "GIT_SSH_COMMAND"} & set(env)
        assert set(env) == allowed
    else:
        assert env["LNK_SECRET_BOT"] == env["TELEGRAM_BOT_TOKEN"] == "0:lnk-secret-bot"
    assert env["PATH"] == SANDBOX_PATH and env["HOME"] == HOME
    assert env["USER"] == env["LOGNAME"] == USER.name and env["LNK_SANDBOX_ID"] == "sbx-1"


@pytest.mark.parametrize(
    ("name", "why"),
    [("LD_PRELOAD", "LD_PRELOAD"), ("HOME", "the box sets it"), ("LNK_SANDBOX_ID", "LNK_")],
)
def test_a_judged_name_the_box_sets_or_refuses_is_refused(name: str, why: str) -> None:
    with pytest.raises(EnvRefused, match=why):
        plan(judged(env={name: "x"}))


def test_the_environment_is_bwraps_whole_environment() -> None:
    p = plan()
    args = p.bwrap_args()
    assert "--clearenv" in args
    assert args.index("--clearenv") < args.index("--setenv")
    pairs = {args[i + 1]: args[i + 2] for i, a in enumerate(args) if a == "--setenv"}
    assert pairs == dict(p.env)


# -- every writable place is noexec; read grants and the prefix are read-only ---------------


@pytest.mark.parametrize(
    "j",
    [judged(), judged(agent=True), judged(internet_any=True), judged(network_host=True)],
    ids=["plain", "agent", "proxy", "host-network"],
)
def test_every_writable_place_is_a_write_rule_and_none_executes(j: Judged) -> None:
    p = plan(j, proxy_socket=f"{STAGING}/proxy.sock" if j.grants.spec.has_proxy else None)
    writes = set(p.policy["write"])
    writable = {dest for dest, how in binds(p).items() if how == "--bind"}
    assert writable <= writes  # nothing mounted writable that Landlock does not know as such
    assert writes == writable | {"/dev"}
    # Under a finite list no execute rule reaches a writable place (staging makes each noexec).
    assert not [x for x in p.policy["execute"] for w in writes if x == w or x.startswith(w + "/")]
    args = p.bwrap_args()
    assert has_run(args, ["--remount-ro", "/dev"])  # /dev: written by nothing, so nothing runs


def test_with_any_command_the_exec_limit_alone_is_lifted() -> None:
    p = plan(judged(commands_any=True))
    assert "/" in p.policy["execute"]
    assert set(p.policy["write"]) == {PROJECT, "/tmp", "/dev/shm", HOME, "/dev"}


def test_read_grants_the_prefix_and_the_system_are_read_only() -> None:
    p = plan(staged=staged(*READ_AND_WRITE, usr=f"{STAGING}/usr"))
    mounted = binds(p)
    assert mounted[NOTES] == mounted[PREFIX] == "--ro-bind"
    assert mounted[PROJECT] == "--bind"
    assert NOTES not in p.policy["write"] and PREFIX not in p.policy["write"]
    assert PREFIX in p.policy["read"] and NOTES in p.policy["read"]
    assert has_run(p.bwrap_args(), ["--ro-bind", f"{STAGING}/usr", "/usr"])


def test_grants_are_mounted_after_the_root_and_the_root_is_read_only_last() -> None:
    args = plan().bwrap_args()
    prefix = args.index(PREFIX)
    assert prefix < args.index(NOTES) and prefix < args.index(PROJECT)
    assert args[-9:] == ["--remount-ro", "/", "--chdir", PROJECT, "--", *plan().layout.command]


def test_hidden_folders_are_covered_by_an_empty_read_only_tmpfs() -> None:
    hidden = f"{PROJECT}/.lnk"
    args = plan(hidden=(hidden,)).bwrap_args()
    assert has_run(args, ["--perms", "0000", "--tmpfs", hidden, "--remount-ro", hidden])
    assert args.index(hidden) > args.index(PROJECT)  # over the grant, not under it


# -- [commands]: exactly the granted executables --------------------------------------------


def test_a_finite_list_executes_exactly_the_judged_programs() -> None:
    j = judged()
    p = plan(j)
    assert p.policy["execute"] == sorted(j.execute) == [GIT, LOADER]
    assert p.layout.command == (str(CFG.confiner), "--", GIT, "status")


# -- an agent: never the host's network nor its bridge's port -------------------------------


@pytest.mark.parametrize(
    "changes",
    [
        {"network_host": True},
        {"ports": (BRIDGE_PORT,)},
        {"models": (dataclasses.replace(MODEL, port=BRIDGE_PORT),)},
    ],
    ids=["host-network", "localhost-port", "model-port"],
)
def test_an_agent_never_gets_the_hosts_network_or_its_bridges_port(
    changes: dict[str, Any],
) -> None:
    j = judged(agent=True, **changes)
    with pytest.raises(LaunchRefused, match="an agent's spec"):
        check_agent_network(j.grants)
    with pytest.raises(LaunchRefused, match="an agent's spec"):
        plan(j, proxy_socket=f"{STAGING}/proxy.sock")


def test_an_agents_sandbox_has_its_bridge_its_home_and_the_client_alone() -> None:
    key = Bind(f"{STAGING}/agent", AGENT_DIR_INSIDE, False)
    write_home = Bind(f"{STAGING}/g2", AGENT_HOME, True)
    p = plan(
        judged(agent=True, ports=(8000,)),
        request(cwd="/somewhere/else"),
        staged=staged(*READ_AND_WRITE, write_home),
        agent_binds=(key,),
        agent_env={"LNK_AGENT": "a1", "HOME": "not this"},
        proxy_socket=f"{STAGING}/proxy.sock",
    )
    args = p.bwrap_args()
    assert "--share-net" not in args
    assert p.policy["bridge_port"] == BRIDGE_PORT and p.policy["tcp_bind"] is None
    assert BRIDGE_PORT not in p.policy["relay_localhost"]
    assert p.env["HOME"] == AGENT_HOME and p.layout.cwd == AGENT_HOME
    assert p.env["PATH"].startswith("/run/lnk-box/bin:")
    assert p.layout.box_links == {"/run/lnk-box/bin/lnk": f"{PREFIX}/venv/bin/lnk"}
    assert binds(p)[AGENT_DIR_INSIDE] == "--ro-bind" and AGENT_DIR_INSIDE in p.policy["read"]


def test_a_plain_sandbox_has_no_bridge_and_no_lnk() -> None:
    p = plan()
    assert "bridge_socket" not in p.policy and not p.layout.box_links
    assert "/run/lnk-box" not in p.env["PATH"]


def test_the_host_network_shares_it_and_listens_on_no_host_port() -> None:
    p = plan(judged(network_host=True))
    assert "--share-net" in p.bwrap_args()
    assert p.policy["tcp_bind"] == [] and p.policy["network_host"] is True
    assert not set(PROXY_NAMES) & set(p.env)


# -- a proxy grant: the listener inside, the relay's policy and variables -------------------


@pytest.mark.parametrize(
    ("changes", "relay_port", "inside"),
    [
        ({"internet_any": True}, 3128, []),
        ({"ports": (3128,)}, 3129, [3128]),
        ({"models": (MODEL,)}, 3128, [8080]),
    ],
)
def test_a_proxy_grant_sets_the_relay_and_its_variables(
    changes: dict[str, Any], relay_port: int, inside: list[int]
) -> None:
    socket = f"{STAGING}/proxy.sock"
    p = plan(judged(**changes), proxy_socket=socket)
    assert p.policy["relay_socket"] == PROXY_SOCKET_INSIDE
    assert p.policy["relay_port"] == relay_port and p.policy["relay_localhost"] == inside
    assert has_run(p.bwrap_args(), ["--ro-bind", socket, PROXY_SOCKET_INSIDE])
    url = f"http://127.0.0.1:{relay_port}"
    assert all(p.env[name] == url for name in PROXY_NAMES)
    assert f"{PREFIX}/venv/bin/lnk-connect %h %p" in p.env["GIT_SSH_COMMAND"]
    assert "/home/owner/.ssh/known_hosts" in p.env["GIT_SSH_COMMAND"]


def test_a_model_rule_sets_its_base_url_to_its_loopback_port() -> None:
    p = plan(judged(models=(MODEL,)), proxy_socket=f"{STAGING}/proxy.sock")
    assert p.env["OPENAI_BASE_URL"] == "http://127.0.0.1:8080/v1"


def test_a_proxy_grant_without_a_staged_listener_is_refused() -> None:
    with pytest.raises(LaunchRefused, match="no listener was staged"):
        plan(judged(internet_any=True))


def test_no_proxy_grant_no_relay() -> None:
    p = plan()
    assert "relay_socket" not in p.policy and PROXY_SOCKET_INSIDE not in p.bwrap_args()


# -- the rest of the composition -------------------------------------------------------------


@pytest.mark.parametrize(
    ("cwd", "inside"),
    [(PROJECT, PROJECT), (f"{PROJECT}/src", f"{PROJECT}/src"), ("/home/owner", HOME)],
)
def test_the_working_folder_is_the_callers_inside_a_grant_else_the_home(
    cwd: str, inside: str
) -> None:
    made = plan(r=request(cwd=cwd))
    assert made.layout.cwd == inside
    assert (made.note != "") is (inside != cwd)  # told exactly when it starts elsewhere


def test_the_note_names_the_folder_where_it_starts_and_the_flags_that_grant_it() -> None:
    assert plan(r=request(cwd="/home/owner")).note == (
        f"lnk: note: /home/owner is not granted to this sandbox; it starts in {HOME} "
        "(grant it with --read /home/owner or --write /home/owner)"
    )


@pytest.mark.parametrize(
    ("asked", "said", "quoted"),
    [
        ("/home/u/my proj", "/home/u/my proj", "'/home/u/my proj'"),  # quoted for a shell
        ("/home/u/a\x1b]0;pwned\x07", "/home/u/a\\x1b]0;pwned\\x07", None),  # no escape runs
        ("/home/u/a\nb", "/home/u/a\\nb", None),  # one line
        ("/home/u/it's", "/home/u/it's", "'/home/u/it'\"'\"'s'"),
    ],
)
def test_the_note_shows_the_callers_path_safely(asked: str, said: str, quoted: str | None) -> None:
    note = cwd_note(asked, "/home/s")
    assert note.startswith(f"lnk: note: {said} is not granted to this sandbox; it starts in ")
    assert note.isprintable()
    if quoted is not None:
        assert f"--read {quoted} or --write {quoted})" in note


def test_the_note_is_one_short_write_whatever_the_path() -> None:
    long = "/" + "\x01" * 4000  # escapes make it four times longer
    note = cwd_note(long, "/home/s")
    assert len(note.encode()) + 1 <= NOTE_LIMIT and note.isprintable()
    assert note == "lnk: note: your folder is not granted to this sandbox; it starts in /home/s"
    assert cwd_note("/home/s", "/home/s") == ""


def test_links_may_be_made_only_in_private_places_without_a_grant_below() -> None:
    inside_home = Bind(f"{STAGING}/g2", f"{HOME}/work", True)
    p = plan(staged=staged(inside_home))
    assert p.policy["symlink"] == ["/dev", "/dev/shm", "/tmp"]
    unsafe = CFG.model_copy(update={"unsafe_write_symlinks": True})
    assert f"{HOME}/work" in plan(cfg=unsafe, staged=staged(inside_home)).policy["symlink"]


def test_private_places_are_the_staged_tmpfs() -> None:
    p = plan()
    args = p.bwrap_args()
    for source, dest in (("tmp", "/tmp"), ("shm", "/dev/shm"), ("home", HOME)):
        assert has_run(args, ["--bind", f"{STAGING}/{source}", dest])


def test_a_terminal_keeps_the_session_and_none_gets_a_new_one() -> None:
    assert "--new-session" in plan().bwrap_args()
    with_terminal = plan(r=request(terminal=TerminalSize(24, 80)))
    assert "--new-session" not in with_terminal.bwrap_args()


def test_the_plan_is_frozen() -> None:
    p = plan()
    with pytest.raises(TypeError):
        p.policy["execute"] = ["/"]  # type: ignore[index]
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.layout = p.layout  # type: ignore[misc]


@pytest.mark.parametrize(
    "j",
    [judged(), judged(agent=True), judged(network_host=True), judged(commands_any=True)],
    ids=["plain", "agent", "host-network", "any-command"],
)
def test_every_namespace_is_new_and_no_further_user_namespace_is_made(j: Judged) -> None:
    args = plan(j).bwrap_args()
    assert args[1:3] == ["--unshare-all", "--unshare-user"]
    assert "--disable-userns" in args and "--die-with-parent" in args
    assert ("--share-net" in args) is j.grants.spec.network_host  # the host's network: asked
    assert has_run(args, ["--hostname", "lnk-sandbox"])  # nothing names the host
