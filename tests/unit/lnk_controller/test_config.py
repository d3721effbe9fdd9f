"""The controller's config: a strict model read from a real file in a temp config dir. Anything
unknown, mistyped or impossible is fatal and named; nothing falls back to a default."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from lnk_controller.config import CONFIG_FILE, UNSAFE_SWITCHES, load_config
from lnk_controller.seccomp import UNSAFE_RELAXATIONS
from lnk_shared.errors import ConfigError


@pytest.fixture
def config_dir(tmp_path: Path) -> Path:
    path = tmp_path / "etc"
    path.mkdir()
    return path


@pytest.fixture
def env(config_dir: Path) -> dict[str, str]:
    return {"LNK_CONFIG_DIR": str(config_dir)}


def write(config_dir: Path, text: str) -> Path:
    path = config_dir / CONFIG_FILE
    path.write_text(text, encoding="utf-8")
    return path


def test_no_file_gives_the_defaults(env: dict[str, str], config_dir: Path) -> None:
    cfg = load_config(env)
    assert cfg.config_dir == config_dir
    assert cfg.state_dir == Path("/var/lib/lnk")
    assert cfg.run_dir == Path("/run/lnk")
    assert cfg.bwrap == Path("/usr/bin/bwrap")
    assert (cfg.uid_first, cfg.uid_last) == (2_000_000_000, 2_000_099_999)
    assert cfg.unsafe_pretend_landlock_abi is None
    assert cfg.database == Path("/var/lib/lnk/controller.db")
    assert cfg.launch_socket == Path("/run/lnk/launch.sock")


def test_file_values_are_read(env: dict[str, str], config_dir: Path) -> None:
    write(config_dir, 'bwrap = "/usr/local/bin/bwrap"\nuid_first = 300000\nuid_last = 300999\n')
    cfg = load_config(env)
    assert cfg.bwrap == Path("/usr/local/bin/bwrap")
    assert (cfg.uid_first, cfg.uid_last) == (300_000, 300_999)


@pytest.mark.parametrize(
    ("var", "field"),
    [("LNK_STATE_DIR", "state_dir"), ("LNK_RUN_DIR", "run_dir"), ("LNK_CONFIG_DIR", "config_dir")],
)
def test_environment_overrides_each_folder(
    env: dict[str, str], config_dir: Path, var: str, field: str
) -> None:
    write(
        config_dir,
        'config_dir = "/file/etc"\nstate_dir = "/file/state"\nrun_dir = "/file/run"\n',
    )
    expected = config_dir if var == "LNK_CONFIG_DIR" else Path(f"/env/{field}")
    cfg = load_config(env | {var: str(expected)})
    assert getattr(cfg, field) == expected
    for other in {"state_dir", "run_dir"} - {field}:
        assert getattr(cfg, other) == Path(f"/file/{other.removesuffix('_dir')}")


@pytest.mark.parametrize(
    ("text", "names"),
    [
        ("uid_frist = 300000\n", "uid_frist"),
        ("[network]\nmode = 'host'\n", "network"),
        ("allow_unsafe = true\n", "allow_unsafe"),
    ],
)
def test_unknown_key_is_fatal_and_named(
    env: dict[str, str], config_dir: Path, text: str, names: str
) -> None:
    path = write(config_dir, text)
    with pytest.raises(ConfigError, match=names) as caught:
        load_config(env)
    assert str(path) in str(caught.value)


WRONG_TYPES = [
    ('uid_first = "many"\n', "uid_first"),
    ("lease_seconds = [3600]\n", "lease_seconds"),
    ("tmp_size_mb = 1.5\n", "tmp_size_mb"),
    ("bwrap = 5\n", "bwrap"),
    ("prefix = { path = '/opt/lnk' }\n", "prefix"),
    ("state_dir = true\n", "state_dir"),
]


@pytest.mark.parametrize(("text", "names"), WRONG_TYPES)
def test_wrong_type_is_fatal_and_named(
    env: dict[str, str], config_dir: Path, text: str, names: str
) -> None:
    write(config_dir, text)
    with pytest.raises(ConfigError, match=names):
        load_config(env)


@pytest.mark.parametrize(
    ("text", "names"),
    [
        ('lease_seconds = "3600"\n', "lease_seconds"),  # a TOML string is not an integer
        ("lease_seconds = true\n", "lease_seconds"),  # nor is a boolean (it would mean 1 s)
        ("unsafe_pretend_landlock_abi = true\n", "unsafe_pretend_landlock_abi"),  # "on" = ABI 1
        ("uid_first = 2000000000.0\n", "uid_first"),  # nor a float
    ],
)
def test_a_value_of_another_toml_type_is_not_coerced(
    env: dict[str, str], config_dir: Path, text: str, names: str
) -> None:
    write(config_dir, text)
    with pytest.raises(ConfigError, match=names):
        load_config(env)


@pytest.mark.parametrize(
    ("text", "names"),
    [
        ("uid_first = 300000\nuid_last = 299999\n", "uid_last"),
        ("uid_first = 0\nuid_last = 1000\n", "uid_first"),  # a sandbox user that is root
        ("uid_first = 1000\nuid_last = 2000\n", "uid_first"),  # login users' uids
        (f"uid_last = {2**31}\n", "uid_last"),  # bwrap writes its uid_map with %d
        (f"uid_first = {2**31}\nuid_last = {2**31 + 10}\n", "uid_first"),
        (f"uid_first = {2**32 - 1}\nuid_last = {2**32 - 1}\n", "uid_first"),  # (uid_t)-1
        ("lease_seconds = 7200\nmax_lease_seconds = 3600\n", "lease_seconds"),
        ("lease_seconds = 0\n", "lease_seconds"),
        ("unsafe_pretend_landlock_abi = 0\n", "unsafe_pretend_landlock_abi"),
    ],
)
def test_impossible_value_is_fatal_and_named(
    env: dict[str, str], config_dir: Path, text: str, names: str
) -> None:
    write(config_dir, text)
    with pytest.raises(ConfigError, match=names):
        load_config(env)


def test_highest_uid_bwrap_accepts_is_allowed(env: dict[str, str], config_dir: Path) -> None:
    write(config_dir, f"uid_first = {2**31 - 100}\nuid_last = {2**31 - 1}\n")
    assert load_config(env).uid_last == 2**31 - 1


@pytest.mark.parametrize("field", ["state_dir", "run_dir", "prefix", "python", "bwrap"])
def test_relative_path_in_the_file_is_refused(
    env: dict[str, str], config_dir: Path, field: str
) -> None:
    write(config_dir, f'{field} = "relative/{field}"\n')
    with pytest.raises(ConfigError, match=field):
        load_config(env)


@pytest.mark.parametrize(
    ("var", "field"),
    [("LNK_STATE_DIR", "state_dir"), ("LNK_RUN_DIR", "run_dir"), ("LNK_CONFIG_DIR", "config_dir")],
)
def test_relative_path_from_the_environment_is_refused(
    env: dict[str, str], var: str, field: str
) -> None:
    with pytest.raises(ConfigError, match=field):
        load_config(env | {var: "relative/dir"})


@pytest.mark.parametrize(
    "content",
    [
        b"uid_first = \n",
        b"[unclosed\n",
        b'bwrap = "/usr/bin/bwrap"\nbwrap = "/tmp/evil"\n',  # a duplicate key is a TOML error
        b'bwrap = "/usr/bin/\xff"\n',  # not UTF-8
    ],
)
def test_malformed_file_is_fatal_and_names_the_file(
    env: dict[str, str], config_dir: Path, content: bytes
) -> None:
    path = config_dir / CONFIG_FILE
    path.write_bytes(content)
    with pytest.raises(ConfigError, match="cannot be read as TOML") as caught:
        load_config(env)
    assert str(path) in str(caught.value)


def test_unreadable_config_path_is_fatal(env: dict[str, str], config_dir: Path) -> None:
    (config_dir / CONFIG_FILE).mkdir()  # a folder where the file should be
    with pytest.raises(ConfigError, match=CONFIG_FILE):
        load_config(env)


def test_unsafe_pretend_landlock_abi_warns(
    env: dict[str, str], config_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    write(config_dir, "unsafe_pretend_landlock_abi = 2\n")
    with caplog.at_level(logging.WARNING, logger="lnk_controller.config"):
        cfg = load_config(env)
    assert cfg.unsafe_pretend_landlock_abi == 2
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "unsafe_pretend_landlock_abi=2" in warnings[0].getMessage()


def test_no_unsafe_setting_no_warning(
    env: dict[str, str], caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING):
        load_config(env)
    assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []


WALL_SWITCHES = (
    "unsafe_host_identity",
    "unsafe_caller_terminal",
    "unsafe_append_stdout",
    "unsafe_write_symlinks",
)


def test_the_wall_switches_are_off_unless_set(env: dict[str, str]) -> None:
    cfg = load_config(env)
    assert [getattr(cfg, name) for name in WALL_SWITCHES] == [False] * len(WALL_SWITCHES)
    assert cfg.unsafe_wall_switches() == []


@pytest.mark.parametrize("switch", WALL_SWITCHES)
def test_a_wall_switch_set_is_named_with_what_it_reopens(
    env: dict[str, str], config_dir: Path, switch: str
) -> None:
    write(config_dir, f"{switch} = true\n")
    (named,) = load_config(env).unsafe_wall_switches()
    assert named.startswith(f"{switch} is on: ") and len(named) > len(switch) + 10


def test_a_wall_switch_is_a_boolean(env: dict[str, str], config_dir: Path) -> None:
    write(config_dir, 'unsafe_write_symlinks = "yes"\n')
    with pytest.raises(ConfigError, match="unsafe_write_symlinks"):
        load_config(env)


@pytest.mark.parametrize(
    ("switch", "seccomp_off"),
    [
        ("unsafe_allow_set_id_modes", {"set_id_modes"}),
        ("unsafe_allow_shared_modes", {"shared_modes"}),
        ("unsafe_allow_host_listen", {"host_listen"}),
        ("unsafe_writable_dev", set()),
        ("unsafe_skip_mode_sweep", set()),
        ("unsafe_loader_maps_anything", set()),
    ],
)
def test_each_class_switch_warns_and_turns_off_only_its_own_rules(
    env: dict[str, str],
    config_dir: Path,
    caplog: pytest.LogCaptureFixture,
    switch: str,
    seccomp_off: set[str],
) -> None:
    write(config_dir, f"{switch} = true\n")
    with caplog.at_level(logging.WARNING, logger="lnk_controller.config"):
        cfg = load_config(env)
    assert cfg.unsafe_switches == (switch,)
    assert cfg.unsafe_seccomp == seccomp_off
    (warning,) = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert f"{switch} is on" in warning.getMessage()
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="lnk_controller.config"):
        cfg.warn_unsafe()  # as each launch does
    assert [r.getMessage() for r in caplog.records] == [warning.getMessage()]


def test_class_switches_are_off_by_default(env: dict[str, str]) -> None:
    cfg = load_config(env)
    assert cfg.unsafe_switches == ()
    assert cfg.unsafe_seccomp == frozenset()


STAGING_SWITCHES = (
    "unsafe_staging_open_to_all",
    "unsafe_command_line_visible",
    "unsafe_placeholders_visible",
    "unsafe_protected_names_unguarded",
    "unsafe_login_path_unjudged",
)


@pytest.mark.parametrize("switch", STAGING_SWITCHES)
def test_each_unsafe_staging_switch_warns_each_time_it_is_asked(
    env: dict[str, str], config_dir: Path, caplog: pytest.LogCaptureFixture, switch: str
) -> None:
    write(config_dir, f"{switch} = true\n")
    cfg = load_config(env)
    assert cfg.unsafe_switches == (switch,)
    caplog.clear()
    for _ in range(2):  # once per launch, not once per start
        with caplog.at_level(logging.WARNING, logger="lnk_controller.config"):
            cfg.warn_unsafe()
    said = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(said) == 2 and said[0] == said[1]
    assert said[0].startswith(f"{switch} is on: ")


def test_no_unsafe_switch_by_default(env: dict[str, str]) -> None:
    assert load_config(env).unsafe_switches == ()


def test_each_unsafe_switch_is_set_by_a_check_test() -> None:
    # A switch no check test sets shows nothing: check's probe of its class could report
    # `refused` whatever the wall did, and no test would see it (tests/e2e/test_check*.py).
    e2e = Path(__file__).resolve().parents[2] / "e2e"
    tests = "".join(p.read_text() for p in sorted(e2e.glob("test_check*.py")))
    assert [s for s in UNSAFE_SWITCHES if f'"{s}' not in tests] == []


def test_each_seccomp_relaxation_has_its_switch() -> None:
    groups = {group for _what, group in UNSAFE_SWITCHES.values() if group is not None}
    assert groups == UNSAFE_RELAXATIONS


def test_allowed_syscalls_are_rows_of_the_deny_list_and_warned(
    env: dict[str, str], config_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    write(config_dir, 'unsafe_allow_syscalls = ["kcmp", "pidfd_getfd"]\n')
    with caplog.at_level(logging.WARNING, logger="lnk_controller.config"):
        cfg = load_config(env)
    assert cfg.unsafe_seccomp == {"allow:kcmp", "allow:pidfd_getfd"}
    said = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(m.startswith("unsafe_allow_syscalls is on: ") and "kcmp" in m for m in said)
    write(config_dir, 'unsafe_allow_syscalls = ["getpid"]\n')
    with pytest.raises(ConfigError, match="getpid is not a row of the deny-list"):
        load_config(env)
