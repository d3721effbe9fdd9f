"""Hostile spec files: each gives a clear SpecError or RefusedError, never a traceback, never a
hang, never another exception type; and the real CLI says so with exit 2 or 3."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from lnk_shared.discovery import context_for, resolve_spec
from lnk_shared.errors import EXIT_REFUSED, EXIT_USAGE, LnkError, RefusedError, SpecError
from lnk_shared.paths import BoxPaths
from lnk_shared.refusals import judge
from lnk_shared.spec import MAX_ENTRIES
from lnk_shared.spec_file import MAX_SPEC_BYTES, load_spec_file

CHECKOUT = Path(__file__).resolve().parents[3]
SOURCE_DIRS = [
    "shared", "services/controller", "services/proxy", "services/bridge-store",
    "services/ssh-gate", "cli", "sandbox", "admin",
]  # fmt: skip

DEEP = 100_000


def run_spec(path: Path | str, home: Path) -> LnkError | None:
    """Read, resolve and judge the spec at `path`; return the LnkError it gave, if any."""
    try:
        spec = load_spec_file(path).build()
        box = BoxPaths(home / "box/c", home / "box/s", home / "box/r")
        env = {"PATH": "/usr/bin:/bin", "XDG_RUNTIME_DIR": str(home / "xdg")}
        ctx = context_for(os.getuid(), env=env, box=box, spec_file=str(path), home=str(home))
        judge(resolve_spec(spec, ctx, path_env="/usr/bin:/bin"), ctx)
    except LnkError as exc:
        return exc
    return None


def expect_clear_error(path: Path | str, home: Path, *phrases: str) -> LnkError:
    error = run_spec(path, home)
    assert error is not None, "a hostile spec was accepted"
    assert isinstance(error, SpecError | RefusedError)
    assert str(error)
    assert "Traceback" not in str(error)
    for phrase in phrases:
        assert phrase in str(error)
    return error


@pytest.fixture
def home(tmp_path: Path) -> Path:
    (tmp_path / "home").mkdir()
    return tmp_path / "home"


def spec_file(tmp_path: Path, content: str | bytes, name: str = "spec.toml") -> Path:
    path = tmp_path / name
    path.write_bytes(content.encode() if isinstance(content, str) else content)
    return path


# --- what the file holds ---------------------------------------------------------------------

CONTENT_CASES = [
    pytest.param("a = " + "[" * DEEP + "]" * DEEP, "nested too deeply", id="deep-arrays"),
    pytest.param("a = " + "{b=" * 60_000 + "}" * 60_000, "nested too deeply", id="deep-tables"),
    pytest.param(
        "folders.read = " + "[" * DEEP + "]" * DEEP, "nested too deeply", id="deep-known-key"
    ),
    pytest.param("a = [" + "[" * DEEP, "not valid TOML", id="deep-unclosed"),
    pytest.param(
        "[folders]\nread = [" + ", ".join(['"/a"'] * 10_000) + "]\n",
        f"spec.toml:2: folders.read: more than {MAX_ENTRIES} entries",
        id="huge-path-array",
    ),
    pytest.param(
        "[internet]\nhosts = [" + ", ".join(f'"h{i}.example"' for i in range(10_000)) + "]\n",
        f"internet.hosts: more than {MAX_ENTRIES} entries",
        id="huge-host-array",
    ),
    pytest.param(
        "[localhost]\nports = [" + ", ".join(str(1 + i % 60000) for i in range(10_000)) + "]",
        f"more than {MAX_ENTRIES} entries",
        id="huge-port-array",
    ),
    pytest.param("[localhost]\nports = [" + "1" * 5000 + "]\n", "not valid TOML", id="huge-int"),
    pytest.param("[folders]\nread = [" + "1" * 100_000 + "]\n", "not valid TOML", id="huger-int"),
    pytest.param(
        '[folders]\nread = ["/tmp/a\\u0000b"]\n', "control character or NUL", id="nul-escape-path"
    ),
    pytest.param(
        '[commands]\nallow = ["bash\\u0000"]\n', "control character or NUL", id="nul-escape-cmd"
    ),
    pytest.param(
        '[internet]\nhosts = ["pypi.org\\u0000.evil.com"]\n',
        "control character",
        id="nul-escape-host",
    ),
    pytest.param('[lan]\nhosts = ["10.0.0.1\\u0000"]\n', "control", id="nul-escape-lan"),
    pytest.param('[browser]\nhosts = ["a\\u0000"]\n', "control", id="nul-escape-browser"),
    pytest.param(b'[folders]\nread = ["/tmp/a\x00b"]\n', "NUL byte", id="raw-nul"),
    pytest.param(b"\x00", "NUL byte", id="raw-nul-only"),
    pytest.param(
        '[folders]\nwrite = ["/tmp/\\u001b[31mred"]\n', "control character", id="escape-seq-path"
    ),
    pytest.param('[folders]\nread = ["a\\u007fb"]\n', "control character", id="del-path"),
    pytest.param('[folders]\nread = ["a\\nb"]\n', "control character", id="newline-path"),
    pytest.param(b'[folders]\nread = ["a\x01b"]\n', "not valid TOML", id="raw-control"),
    pytest.param(b'[folders]\nread = ["a\rb"]\n', "not valid TOML", id="raw-cr"),
    pytest.param(
        '[internet]\nhosts = ["pypi.org\\r\\nHost: evil.com"]\n',
        "control character",
        id="crlf-host",
    ),
    pytest.param('[internet]\nhosts = ["pypi.org\\t"]\n', "control character", id="tab-host"),
    pytest.param(b"\xff\xfe[folders]\n", "not UTF-8", id="non-utf8"),
    pytest.param("[folders]\nread = ['é']\n".encode("latin-1"), "not UTF-8", id="latin-1"),
    pytest.param("[folders]\n".encode("utf-16"), "not UTF-8", id="utf-16"),
    pytest.param(b'[folders]\nread = ["\xc0\xaf"]\n', "not UTF-8", id="overlong-utf8"),
    pytest.param(b'[folders]\nread = ["\xed\xa0\x80"]\n', "not UTF-8", id="utf8-surrogate"),
    pytest.param('[folders]\nread = ["\\udc80"]\n', "not valid TOML", id="escaped-surrogate"),
    pytest.param("# " + "x" * MAX_SPEC_BYTES + "\n", "larger than", id="too-large"),
    pytest.param('[internet]\nhosts = ["xn--zz.com"]\n', "international", id="bad-punycode"),
    pytest.param('[internet]\nhosts = ["xn--.com"]\n', "international", id="empty-punycode"),
    pytest.param('[internet]\nhosts = ["*.com"]\n', "top-level domain", id="star-tld"),
    pytest.param('[internet]\nhosts = ["py*pi.org"]\n', "'*' only", id="star-inside-name"),
    pytest.param('[internet]\nhosts = ["a.*.org"]\n', "'*' only", id="star-label"),
    pytest.param('[internet]\nhosts = ["*.*.org"]\n', "'*' only", id="double-star"),
    pytest.param('[lan]\nhosts = ["*.10.0.0.1"]\n', "numeric", id="star-address"),
    pytest.param('[internet]\nhosts = ["localhost"]\n', "localhost", id="localhost"),
    pytest.param('[internet]\nhosts = ["LocalHost."]\n', "localhost", id="localhost-dot"),
    pytest.param('[lan]\nhosts = ["localhost"]\n', "localhost", id="localhost-lan"),
    pytest.param('[internet]\nhosts = ["127.0.0.1"]\n', "an address", id="loopback-address"),
    pytest.param('[internet]\nhosts = ["user@pypi.org"]\n', "only letters", id="at-sign"),
    pytest.param('[internet]\nhosts = ["pypi.org#@evil.com"]\n', "only letters", id="hash"),
    pytest.param('[internet]\nhosts = ["pypi%2eorg"]\n', "only letters", id="percent"),
    pytest.param('[internet]\nhosts = ["evil.com\\\\pypi.org"]\n', "only letters", id="backslash"),
    pytest.param('[internet]\nhosts = ["a\uff20pypi.org"]\n', "international", id="fullwidth-at"),
    pytest.param('[internet]\nhosts = ["pypi.org:99999"]\n', "port", id="port-range"),
    pytest.param('[localhost]\nports = ["*"]\n', "[localhost-port]", id="star-port"),
    pytest.param("[localhost]\nports = [40781]\n", "main proxy", id="main-proxy-port"),
    pytest.param('[network]\nmode = "host\\u0000"\n', 'expected "host"', id="nul-mode"),
    pytest.param("[folders]\nread = [{a = 1}]\n", "nested table", id="table-in-list"),
    pytest.param("[" * 1000 + "x" + "]" * 1000, "not valid TOML", id="bracket-header"),
]


@pytest.mark.parametrize(("content", "phrase"), CONTENT_CASES)
def test_hostile_spec_content_is_a_clear_error(
    tmp_path: Path, home: Path, content: str | bytes, phrase: str
) -> None:
    path = spec_file(tmp_path, content)
    error = expect_clear_error(path, home, phrase)
    assert str(path) in str(error) or isinstance(error, RefusedError)


def test_homograph_host_is_granted_only_under_its_punycode_name(tmp_path: Path) -> None:
    # Not refused: the grant is for the look-alike domain itself, and it is shown as xn--...
    path = spec_file(tmp_path, '[internet]\nhosts = ["p\u0430ypal.com"]\n')
    (host,) = load_spec_file(path).build().internet
    assert host.name.startswith("xn--")
    assert host.name.isascii()
    assert host.name != "paypal.com"


# --- what the file is ------------------------------------------------------------------------


def make_fifo(tmp_path: Path) -> Path:
    os.mkfifo(tmp_path / "fifo.toml")
    return tmp_path / "fifo.toml"


def make_sparse_huge(tmp_path: Path) -> Path:
    path = tmp_path / "huge.toml"
    with open(path, "wb") as f:
        f.truncate(10 * 1024**3)  # 10 GiB, sparse: refused on its size, never read
    return path


def make_loop(tmp_path: Path) -> Path:
    (tmp_path / "loop.toml").symlink_to("loop.toml")
    return tmp_path / "loop.toml"


def make_folder(tmp_path: Path) -> Path:
    return tmp_path


FILE_KINDS: list[tuple[str, Callable[[Path], Path | str], str]] = [
    ("fifo", make_fifo, "not a regular file"),
    ("dev-zero", lambda _: "/dev/zero", "not a regular file"),
    ("dev-null", lambda _: "/dev/null", "not a regular file"),
    ("folder", make_folder, "not a regular file"),
    ("sparse-10GiB", make_sparse_huge, "larger than"),
    ("link-loop", make_loop, "cannot open the spec file"),
    ("missing", lambda p: p / "absent.toml", "cannot open the spec file"),
]


@pytest.mark.parametrize(("kind", "make", "phrase"), FILE_KINDS, ids=[k[0] for k in FILE_KINDS])
def test_hostile_spec_path_is_a_clear_error_without_hanging(
    tmp_path: Path, home: Path, kind: str, make: Callable[[Path], Path | str], phrase: str
) -> None:
    expect_clear_error(make(tmp_path), home, phrase)


# --- what the spec names ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "links",
    [
        {"loop": "loop"},
        {"ping": "pong", "pong": "ping"},
        {"up": "up/.."},
        {"a": "b/x", "b": "a"},
    ],
)
def test_link_loop_in_a_granted_path_is_a_clear_error(
    tmp_path: Path, home: Path, links: dict[str, str]
) -> None:
    for name, target in links.items():
        (tmp_path / name).symlink_to(target)
    first = next(iter(links))
    for key in ("read", "write"):
        path = spec_file(tmp_path, f'[folders]\n{key} = ["{first}/sub"]\n', f"{key}.toml")
        expect_clear_error(path, home, "too many links", f"folders.{key}")
    path = spec_file(tmp_path, f'[commands]\nallow = ["./{first}"]\n', "cmd.toml")
    expect_clear_error(path, home, "too many links", "commands.allow")


def test_very_long_path_components_are_a_clear_error(tmp_path: Path, home: Path) -> None:
    path = spec_file(tmp_path, f'[folders]\nread = ["/{"a" * 4000}"]\n')
    expect_clear_error(path, home, "cannot be granted")


# --- the real CLI, once per family -----------------------------------------------------------

CLI_CASES: list[tuple[str, Callable[[Path], Path | str]]] = [
    ("deep-nesting", lambda p: spec_file(p, "a = " + "[" * DEEP + "]" * DEEP)),
    ("huge-array", lambda p: spec_file(p, "folders.read = [" + '"/a",' * 10_000 + "]")),
    ("huge-int", lambda p: spec_file(p, "localhost.ports = [" + "9" * 5000 + "]")),
    ("nul-escape", lambda p: spec_file(p, 'folders.read = ["/a\\u0000"]')),
    ("raw-nul", lambda p: spec_file(p, b'folders.read = ["/a\x00"]')),
    ("control-host", lambda p: spec_file(p, 'internet.hosts = ["a.com\\r\\nX: y"]')),
    ("non-utf8", lambda p: spec_file(p, b"\xff\xfe\x00")),
    ("too-large", lambda p: spec_file(p, b"#" * (MAX_SPEC_BYTES + 1))),
    ("fifo", make_fifo),
    ("dev-zero", lambda _: "/dev/zero"),
    ("link-loop-spec", make_loop),
    ("bad-hosts", lambda p: spec_file(p, 'internet.hosts = ["*.com", "x@y.org"]')),
    ("star-port", lambda p: spec_file(p, 'localhost.ports = ["*"]')),
    ("metadata-lan", lambda p: spec_file(p, 'lan.hosts = ["100.100.100.200"]')),
]


def loop_in_granted_path(tmp_path: Path) -> Path:
    (tmp_path / "ping").symlink_to("pong")
    (tmp_path / "pong").symlink_to("ping")
    return spec_file(tmp_path, 'folders.read = ["ping"]\n')


CLI_CASES.append(("link-loop-grant", loop_in_granted_path))


@pytest.mark.parametrize(("family", "make"), CLI_CASES, ids=[c[0] for c in CLI_CASES])
def test_cli_reports_hostile_spec_without_a_traceback(
    tmp_path: Path, family: str, make: Callable[[Path], Path | str]
) -> None:
    env = {
        "PATH": "/usr/bin:/bin",
        "PYTHONPATH": os.pathsep.join(str(CHECKOUT / d) for d in SOURCE_DIRS),
        "LNK_CONFIG_DIR": str(tmp_path / "box/config"),
        "LNK_STATE_DIR": str(tmp_path / "box/state"),
        "LNK_RUN_DIR": str(tmp_path / "box/run"),
    }
    result = subprocess.run(
        [sys.executable, "-m", "lnk_cli", "spec", "show", "--spec", str(make(tmp_path))],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode in (EXIT_USAGE, EXIT_REFUSED), result.stderr
    assert "Traceback" not in result.stderr
    assert result.stderr.startswith("lnk: ")
    assert result.stdout == ""
