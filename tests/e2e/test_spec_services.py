"""A spec's [[services]], end to end on the installed box: `lnk spec show` and the approval
question name each rule's host, its secret by name and what it allows; a change in a rule asks
again; a spec or flag carrying a secret's value is refused without repeating it; Telegram's
setWebhook is refused whatever the spec says; and a sandbox whose rule names a secret the
owner does not keep is not started (test_service_relay.py runs one that is)."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
from pathlib import Path
from typing import Any

import pytest
from as_user import as_user
from on_pty import answer_on_pty

Box = Any  # tests/e2e/conftest.py
RunningBox = Any

pytestmark = [pytest.mark.e2e]

LNK = Path(os.environ.get("LNK_PREFIX", "/opt/lnk")) / "venv" / "bin" / "lnk"
EXIT_USAGE = 2
EXIT_REFUSED = 3
EXIT_RUN_REFUSED = 126  # a run refused (lnk_shared.errors)
BOT = '[[services]]\nkind = "telegram"\nsecret = "bot"\nallow = ["getMe", "sendMessage"]\n'


def _token() -> str:
    return f"{secrets.randbelow(10**9) + 10**9}:AA{secrets.token_urlsafe(26)[:33]}"


def _spec(folder: Path, text: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    spec = folder / "bot.toml"
    spec.write_text(text)
    return spec


def test_show_names_the_host_the_secret_and_what_it_allows(box: Box, tmp_path: Path) -> None:
    spec = _spec(tmp_path / "specs", BOT)
    shown = box.lnk("spec", "show", "--spec", str(spec))
    assert shown.returncode == 0, shown.stderr
    assert "telegram https://api.telegram.org" in shown.stdout
    assert "the secret bot added outside" in shown.stdout
    assert "getMe, sendMessage" in shown.stdout
    assert "never setWebhook, logOut or close" in shown.stdout
    doc = json.loads(box.lnk("spec", "show", "--spec", str(spec), "--json").stdout)
    assert doc["grants"]["services"] == [
        {
            "kind": "telegram",
            "host": "api.telegram.org",
            "secret": "bot",
            "allow": ["getme", "sendmessage"],
        }
    ]
    flags = box.lnk("spec", "show", "--service", "telegram:bot:getMe,sendMessage", "--json")
    assert flags.returncode == 0, flags.stderr
    assert json.loads(flags.stdout)["hash"] == doc["hash"]  # the same rule, the same hash


@pytest.mark.parametrize(
    "text",
    [
        '[[services]]\nkind = "telegram"\ntoken = "{token}"\nallow = ["getMe"]\n',
        '[[services]]\nkind = "telegram"\nsecret = "{token}"\nallow = ["getMe"]\n',
        '[[services]]\nkind = "telegram"\nsecret = "bot"\nallow = ["getMe", "{token}"]\n',
    ],
    ids=["value-key", "value-as-name", "value-in-allow"],
)
def test_a_spec_carrying_a_value_is_refused_without_repeating_it(
    box: Box, tmp_path: Path, text: str
) -> None:
    token = _token()
    spec = _spec(tmp_path / "specs", text.format(token=token))
    shown = box.lnk("spec", "show", "--spec", str(spec))
    assert shown.returncode == EXIT_USAGE, shown.stderr
    assert "secret's value" in shown.stderr
    assert token not in shown.stdout + shown.stderr
    assert token.split(":")[1][:12] not in shown.stderr
    assert "Traceback" not in shown.stderr


def test_a_flag_carrying_a_value_is_refused_without_repeating_it(box: Box) -> None:
    token = _token()
    shown = box.lnk("spec", "show", "--service", f"telegram:{token}:getMe")
    assert shown.returncode == EXIT_USAGE, shown.stderr
    assert token not in shown.stderr and token.split(":")[1][:12] not in shown.stderr


@pytest.mark.parametrize("method", ["setWebhook", "logout", "CLOSE"])
def test_telegrams_refused_methods_are_refused_whatever_the_spec_says(
    box: Box, tmp_path: Path, method: str
) -> None:
    spec = _spec(tmp_path / "specs", BOT.replace('"sendMessage"', f'"{method}"'))
    shown = box.lnk("spec", "show", "--spec", str(spec))
    assert shown.returncode == EXIT_REFUSED, shown.stderr
    assert "refused [service]" in shown.stderr and method in shown.stderr


def _owned_spec(running_box: RunningBox, text: str) -> Path:
    owner = running_box.owner
    folder = owner.home / ("services-" + secrets.token_hex(3))
    spec = _spec(folder, text)
    subprocess.run(["chown", "-R", f"{owner.uid}:{owner.gid}", str(folder)], check=True)
    return spec


@pytest.mark.needs_root
def test_the_question_shows_the_rule_and_a_changed_rule_asks_again(
    running_box: RunningBox,
) -> None:
    owner = running_box.owner
    spec = _owned_spec(running_box, BOT)

    def approve() -> tuple[int, str]:
        status, seen = answer_on_pty(
            as_user(owner.uid, owner.gid, str(LNK), "spec", "approve", "--spec", str(spec)),
            "y",
            env=running_box.owner_env(),
            cwd=owner.home,
        )
        return status, seen.decode(errors="replace")

    status, screen = approve()
    assert status == 0, screen
    assert "has not run here before" in screen
    assert "the secret bot added outside" in screen and "getMe, sendMessage" in screen
    quiet = running_box.as_owner("spec", "approve", "--spec", str(spec))
    assert quiet.returncode == 0 and "already approved" in quiet.stdout, quiet.stderr
    spec.write_text(BOT.replace('"sendMessage"', '"sendMessage", "getUpdates"'))
    status, screen = approve()
    assert status == 0, screen
    assert "opens something else" in screen and "+ service" in screen
    assert "getupdates" in screen
    spec.write_text(BOT.replace('"bot"', '"other-bot"'))  # another secret: asked again
    status, screen = approve()
    assert status == 0, screen
    assert "opens something else" in screen and "other-bot" in screen


@pytest.mark.needs_root
def test_a_sandbox_whose_rule_names_a_secret_not_kept_is_not_started(
    running_box: RunningBox,
) -> None:
    marker = running_box.owner.home / ("ran-" + secrets.token_hex(3))
    name = "unset-" + secrets.token_hex(3)
    ran = running_box.run(
        "--service", f"telegram:{name}:getMe", cmd=["/usr/bin/touch", str(marker)]
    )
    assert ran.returncode == EXIT_RUN_REFUSED, ran.stderr
    assert f"refused [launch]: [[services]] secret '{name}'" in ran.stderr
    assert f"lnk secret set {name}" in ran.stderr
    assert not marker.exists()
    listed = running_box.as_owner("sandbox", "list", "--all", "--json")
    assert str(marker) not in listed.stdout  # no sandbox was even recorded
