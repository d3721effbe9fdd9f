"""lnk_proxy.hosted_grant: a CONNECT to a hosted rule's provider is refused whatever it is
spelled as, and each rule keeps its own record of the response ids it was given."""

from __future__ import annotations

import pytest

from lnk_proxy.hosted_grant import HostedGrant, hosted_placeholder
from lnk_proxy.http_request import RequestRefused, parse_request_head
from lnk_shared.spec import Origin
from lnk_shared.spec_models import parse_model_table

ORIGIN = Origin("spec.toml", "models[0]", 1)
CLAUDE = parse_model_table({"kind": "anthropic", "models": ["claude-x"], "secret": "c"}, ORIGIN)
GPT = parse_model_table({"kind": "openai", "models": ["gpt-x"], "secret": "o"}, ORIGIN)
LOCAL = parse_model_table({"kind": "ollama", "models": ["llama3.2:3b"]}, ORIGIN)


def _connect(target: str) -> bytes:
    return f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode()


@pytest.mark.parametrize(
    "target",
    [
        "api.anthropic.com:443",
        "API.Anthropic.COM:443",
        "api.anthropic.com.:443",
        "api.openai.com:443",
        "api.openai.com:8443",
    ],
)
def test_a_connect_to_a_providers_host_is_refused(target: str) -> None:
    grant = HostedGrant((CLAUDE, GPT, LOCAL))
    with pytest.raises(RequestRefused) as caught:
        grant.refuse_connect(parse_request_head(_connect(target)))
    assert caught.value.rule == "model-plain-http-only"


def test_other_hosts_and_local_rules_are_not_the_grants() -> None:
    grant = HostedGrant((CLAUDE, LOCAL))
    assert grant.rules == (CLAUDE,)
    grant.refuse_connect(parse_request_head(_connect("api.openai.com:443")))
    assert grant.rule_for_host("api.openai.com") is None
    assert grant.rule_for_host("bad host") is None
    assert HostedGrant().rule_for_host("api.anthropic.com") is None


def test_each_rule_keeps_its_own_ids_and_its_placeholder_names_its_secret() -> None:
    grant = HostedGrant((CLAUDE, GPT))
    grant.issued(GPT).learn("resp_1")
    assert "resp_1" in grant.issued(GPT) and "resp_1" not in grant.issued(CLAUDE)
    assert "resp_1" not in HostedGrant((GPT,)).issued(GPT)  # another sandbox's grant
    assert hosted_placeholder(GPT) == "lnk-secret-o"
