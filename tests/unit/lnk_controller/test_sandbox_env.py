"""The sandbox's environment composed in one place: the user's layer between the caller's
terminal and the box's services, and never over a name the box sets."""

from __future__ import annotations

import pytest

from lnk_controller.sandbox_env import compose_environment
from lnk_shared.errors import EnvRefused

IDENTITY = {"PATH": "/usr/bin:/bin", "HOME": "/home/s", "LNK_SANDBOX_ID": "sbx-1"}
SERVICES = {"HTTPS_PROXY": "http://127.0.0.1:3128", "MADE_BY_A_NEW_BOX_LAYER": "1"}


def test_each_layer_in_its_order() -> None:
    env = compose_environment(
        identity=IDENTITY,
        terminal={"TERM": "xterm", "LANG": "C.UTF-8"},
        user={"API_KEY": "k", "LANG": "de_DE.UTF-8"},
        services=SERVICES,
    )
    assert env["API_KEY"] == "k"
    assert env["LANG"] == "de_DE.UTF-8"  # the user's over the terminal's
    assert env["HTTPS_PROXY"] == SERVICES["HTTPS_PROXY"]
    assert env["PATH"] == IDENTITY["PATH"]


@pytest.mark.parametrize(
    "name",
    [
        "PATH",  # refused by the names table
        "LNK_SANDBOX_ID",
        "HTTPS_PROXY",
        "MADE_BY_A_NEW_BOX_LAYER",  # not in the table: held because a box layer sets it
    ],
)
def test_a_user_name_the_box_sets_is_refused_not_overridden(name: str) -> None:
    with pytest.raises(EnvRefused, match=name):
        compose_environment(identity=IDENTITY, terminal={}, user={name: "mine"}, services=SERVICES)


def test_no_user_layer_is_the_box_alone() -> None:
    env = compose_environment(identity=IDENTITY, terminal={}, user={}, services=SERVICES)
    assert env == {**IDENTITY, **SERVICES}


def test_the_unsafe_switch_skips_the_table_but_never_a_name_the_box_sets() -> None:
    env = compose_environment(
        identity=IDENTITY,
        terminal={},
        user={"BASH_ENV": "/x"},
        services=SERVICES,
        unsafe_unjudged=True,
    )
    assert env["BASH_ENV"] == "/x"
    with pytest.raises(EnvRefused, match="PATH"):
        compose_environment(
            identity=IDENTITY,
            terminal={},
            user={"PATH": "/x"},
            services=SERVICES,
            unsafe_unjudged=True,
        )
