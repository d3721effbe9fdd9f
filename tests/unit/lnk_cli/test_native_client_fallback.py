"""Everything the C `lnk` client (lnk_cli/native/lnk_client.c) leaves to the Python CLI: other
words, forms that are not plain, a terminal; the Python CLI it execs is the venv's own (never a
`lnk_cli` folder in the caller's), and without one beside it the client says so; the messages and
statuses it gives itself (no launch socket, a spec it cannot open or too large) are Python's.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from native_launch import (
    TIMEOUT_S,
    Controller,
    Word,
    answer_with,
    client_env,
    exit_frame,
    python_client,
    run_client,
)

from lnk_shared.errors import EXIT_ERROR, EXIT_RUN_ERROR


@pytest.mark.parametrize(
    "words",
    [
        ["--version"],
        ["--help"],
        ["sandbox", "run", "--help"],
        ["sandbox", "list"],
        ["sandbox", "run", "--spec", "-x", "--", "true"],  # argparse's usage error
        ["sandbox", "run", "--yes", "--"],  # no program
    ],
)
def test_other_words_get_the_python_clis_answer(
    native_client: Path, controller: Controller, words: list[str]
) -> None:
    env = client_env(controller, {"LNK_STATE_DIR": str(controller.run_dir / "state")})
    native = run_client([native_client], list(words), env)
    python = run_client(python_client(), list(words), env)
    assert (native.returncode, native.stdout, native.stderr) == (
        python.returncode,
        python.stdout,
        python.stderr,
    )
    assert native.stdout or native.stderr


@pytest.mark.parametrize(
    "words",
    [
        ["sandbox", "run", "--read", ".", "--", "true"],  # a spec flag
        ["sandbox", "run", "--ye", "--", "true"],  # an abbreviation argparse takes
    ],
)
def test_a_form_that_is_not_plain_is_the_python_clients(
    native_client: Path, controller: Controller, words: list[str], tmp_path: Path
) -> None:
    controller.serve(answer_with(controller, exit_frame(0)))
    ran = run_client([native_client], words, client_env(controller), cwd=tmp_path)
    launch = controller.check()
    assert ran.returncode == 0, ran.stderr
    assert os.path.basename(launch.exe).startswith("python")


@pytest.mark.parametrize("terminal_on", ["stdin", "stdout", "both"])
def test_a_terminal_sends_it_to_the_python_client(
    native_client: Path, controller: Controller, terminal_on: str
) -> None:
    primary, secondary = os.openpty()
    try:
        controller.serve(answer_with(controller, exit_frame(0)))
        streams = {
            "stdin": secondary if terminal_on in ("stdin", "both") else subprocess.DEVNULL,
            "stdout": secondary if terminal_on in ("stdout", "both") else subprocess.PIPE,
        }
        ran = subprocess.run(
            [native_client, "sandbox", "run", "--yes", "--", "true"],
            env=client_env(controller, {"TERM": "dumb"}),
            stderr=subprocess.PIPE,
            timeout=TIMEOUT_S,
            check=False,
            **streams,  # type: ignore[arg-type]
        )
        launch = controller.check()
    finally:
        os.close(primary)
        os.close(secondary)
    assert ran.returncode == 0, ran.stderr
    assert os.path.basename(launch.exe).startswith("python")
    # Only with both a terminal does Python relay one (the C path never does).
    assert (launch.message["terminal"] is not None) is (terminal_on == "both")


def test_a_lnk_cli_folder_in_the_callers_folder_is_not_imported(
    native_client: Path, tmp_path: Path
) -> None:
    planted = tmp_path / "lnk_cli"
    planted.mkdir()
    marker = tmp_path / "imported"
    code = f"open({str(marker)!r}, 'w').close()\nprint('planted')\n"
    (planted / "__init__.py").write_text(code)
    (planted / "__main__.py").write_text("def main():\n    print('planted main')\n")
    env: dict[Word, Word] = {"PATH": "/usr/bin:/bin"}
    if "PYTHONPATH" in os.environ:
        env["PYTHONPATH"] = os.environ["PYTHONPATH"]
    ran = run_client([native_client], ["--version"], env, cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.startswith(b"lnk ")
    assert b"planted" not in ran.stdout
    assert not marker.exists()


def test_without_a_python_beside_it_the_fallback_says_so(
    native_client: Path, tmp_path: Path
) -> None:
    alone = tmp_path / "lnk"
    alone.write_bytes(native_client.read_bytes())
    alone.chmod(0o755)
    ran = run_client([alone], ["--version"], {"PATH": "/usr/bin:/bin"})
    assert ran.returncode == 1
    expected = f"lnk: cannot run the Python CLI ({tmp_path}/python3): No such file or directory\n"
    assert ran.stderr == expected.encode()


def test_without_a_python_beside_it_a_run_fails_with_a_runs_status(
    native_client: Path, tmp_path: Path
) -> None:
    alone = tmp_path / "lnk"
    alone.write_bytes(native_client.read_bytes())
    alone.chmod(0o755)
    for words, status in (
        (["sandbox", "run", "--read", ".", "--", "true"], EXIT_RUN_ERROR),
        (["agent", "start", "bot1"], EXIT_RUN_ERROR),
        (["sandbox", "list"], EXIT_ERROR),
    ):
        ran = run_client([alone], words, {"PATH": "/usr/bin:/bin"})
        assert ran.returncode == status, (words, ran.stderr)
        assert ran.stderr.startswith(b"lnk: cannot run the Python CLI (")


def test_the_c_clients_statuses_are_the_python_ones() -> None:
    import re

    from lnk_cli.exit_statuses import RUNS
    from lnk_shared import errors

    native = Path(__file__).parents[3] / "cli/lnk_cli/native"
    header = (native / "lnk_client.h").read_text()
    for name in ("EXIT_ERROR", "EXIT_RUN_ERROR", "EXIT_RUN_REFUSED"):
        found = re.search(rf"#define {name} (\d+)", header)
        assert found is not None and int(found[1]) == getattr(errors, name), name
    listed = re.search(r"runs\[\]\[2\] = \{(.*?)\};", (native / "lnk_client.c").read_text())
    assert listed is not None
    assert set(re.findall(r'\{"(\w+)", "(\w+)"\}', listed[1])) == set(RUNS)


def test_no_launch_socket_is_the_python_message(native_client: Path, tmp_path: Path) -> None:
    env: dict[Word, Word] = {"PATH": "/usr/bin:/bin", "LNK_RUN_DIR": str(tmp_path)}
    if "PYTHONPATH" in os.environ:
        env["PYTHONPATH"] = os.environ["PYTHONPATH"]
    words = ["sandbox", "run", "--yes", "--", "true"]
    native, python = (
        run_client([native_client], words, env),
        run_client(python_client(), words, env),
    )
    assert (native.returncode, native.stderr) == (python.returncode, python.stderr)
    assert (
        native.stderr
        == (
            f"lnk: the box is not running (no launch socket in {tmp_path}); "
            "start it with `lnk box up`\n"
        ).encode()
    )
    assert native.returncode == EXIT_RUN_ERROR


def test_a_spec_file_that_cannot_be_opened_is_the_python_message(
    native_client: Path, controller: Controller, tmp_path: Path
) -> None:
    words = ["sandbox", "run", "--spec", "missing \xe9.toml", "--", "true"]
    env = client_env(controller)
    native = run_client([native_client], words, env, cwd=tmp_path)
    python = run_client(python_client(), words, env, cwd=tmp_path)
    assert (native.returncode, native.stderr) == (python.returncode, python.stderr)
    assert native.returncode == EXIT_RUN_ERROR
    assert (
        native.stderr
        == "lnk: missing é.toml: cannot open the spec file: No such file or directory\n".encode()
    )


def test_an_oversized_spec_is_refused_by_both_clients_before_anything_is_sent(
    native_client: Path, controller: Controller, tmp_path: Path
) -> None:
    from lnk_shared.spec_size import MAX_SPEC_BYTES

    big = tmp_path / "big.toml"
    big.write_bytes(b"#" * (MAX_SPEC_BYTES + 1))
    words = ["sandbox", "run", "--spec", str(big), "--", "true"]
    env = client_env(controller)
    native = run_client([native_client], words, env, cwd=tmp_path)
    python = run_client(python_client(), words, env, cwd=tmp_path)
    assert (native.returncode, native.stderr) == (python.returncode, python.stderr)
    assert native.returncode == EXIT_RUN_ERROR
    assert (
        native.stderr
        == (
            f"lnk: {big}: the spec is larger than {MAX_SPEC_BYTES} bytes (256 KiB; this one has "
            f"{MAX_SPEC_BYTES + 1} or more): a spec is a few lines of TOML, so this is not one\n"
        ).encode()
    )
    controller.listener.settimeout(0)
    with pytest.raises(BlockingIOError):  # neither client connected: nothing was sent
        controller.listener.accept()


def test_the_c_clients_spec_limit_is_the_python_one() -> None:
    import re

    from lnk_shared.spec_size import MAX_SPEC_BYTES

    source = Path(__file__).parents[3] / "cli/lnk_cli/native/lnk_client.c"
    found = re.search(r"#define SPEC_MAX_BYTES \((\d+) \* (\d+)\)", source.read_text())
    assert found is not None
    assert int(found[1]) * int(found[2]) == MAX_SPEC_BYTES
