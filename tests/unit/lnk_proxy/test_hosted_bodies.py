"""lnk_proxy.hosted_bodies: a hosted model request's body, judged. Tools are kept by shape (an
allowlist), every server tool removed whatever its version; each URL-bearing or stored-object
field is a row that must be refused; a tool_choice naming a removed tool becomes auto."""

from __future__ import annotations

from typing import Any

import pytest

from lnk_proxy.hosted_bodies import judge_body, kept_tool
from lnk_proxy.strict_json import BodyRefused

MODELS = {"claude-x", "gpt-x"}
NONE_ISSUED: frozenset[str] = frozenset()


def _judge(
    kind: str, endpoint: str, body: dict[str, Any], issued: frozenset[str] = NONE_ISSUED
) -> tuple[dict[str, Any], tuple[str, ...]]:
    return judge_body(kind, endpoint, body, MODELS.__contains__, issued)


@pytest.mark.parametrize(
    ("kind", "endpoint", "tool", "kept"),
    [
        ("anthropic", "messages", {"name": "f", "input_schema": {}}, True),
        ("anthropic", "messages", {"type": "custom", "name": "f", "input_schema": {}}, True),
        ("anthropic", "messages", {"type": "bash_20250124", "name": "bash"}, True),
        ("anthropic", "messages", {"type": "text_editor_20250728", "name": "e"}, True),
        ("anthropic", "messages", {"type": "computer_20251124", "name": "computer"}, True),
        ("anthropic", "messages", {"type": "memory_20250818", "name": "memory"}, True),
        ("anthropic", "messages", {"type": "web_search_20250305", "name": "web_search"}, False),
        ("anthropic", "messages", {"type": "web_search_20260209", "name": "web_search"}, False),
        ("anthropic", "messages", {"type": "web_fetch_20250910", "name": "web_fetch"}, False),
        ("anthropic", "messages", {"type": "code_execution_20250825", "name": "c"}, False),
        ("anthropic", "messages", {"type": "mcp_toolset", "mcp_server_name": "s"}, False),
        ("anthropic", "messages", {"type": "advisor_20260301", "name": "a"}, False),
        ("anthropic", "messages", {"type": "tool_search_tool_regex_20251119", "name": "t"}, False),
        ("anthropic", "messages", {"type": "bash_toolset_20260801", "name": "b"}, False),
        ("anthropic", "messages", {"type": "bash_2025012", "name": "bash"}, False),
        ("anthropic", "messages", {"type": "xbash_20250124", "name": "bash"}, False),
        ("anthropic", "messages", "bash", False),
        ("openai", "chat", {"type": "function", "function": {"name": "f"}}, True),
        ("openai", "chat", {"type": "custom", "custom": {"name": "f"}}, True),
        ("openai", "chat", {"function": {"name": "f"}}, False),
        ("openai", "chat", {"type": "web_search"}, False),
        ("openai", "responses", {"type": "function", "name": "f"}, True),
        ("openai", "responses", {"type": "custom", "name": "f"}, True),
        ("openai", "responses", {"type": "computer_use_preview"}, True),
        ("openai", "responses", {"type": "local_shell"}, True),
        ("openai", "responses", {"type": "apply_patch"}, True),
        ("openai", "responses", {"type": "shell"}, True),
        ("openai", "responses", {"type": "shell", "environment": {"type": "local"}}, True),
        (
            "openai",
            "responses",
            {"type": "shell", "environment": {"type": "container_auto"}},
            False,
        ),
        ("openai", "responses", {"type": "web_search"}, False),
        ("openai", "responses", {"type": "web_search_preview_2025_03_11"}, False),
        ("openai", "responses", {"type": "file_search", "vector_store_ids": ["vs_1"]}, False),
        ("openai", "responses", {"type": "mcp", "server_url": "https://x.example"}, False),
        ("openai", "responses", {"type": "code_interpreter", "container": {"type": "auto"}}, False),
        ("openai", "responses", {"type": "image_generation"}, False),
        ("openai", "responses", {"type": "tool_search"}, False),
        ("openai", "responses", {"name": "f"}, False),
        ("openai", "chat", {"type": ["function"]}, False),  # unhashable where a name goes
        ("anthropic", "messages", {"type": {"bash_20250124": 1}}, False),
    ],
)
def test_tools_are_kept_by_shape_only(kind: str, endpoint: str, tool: object, kept: bool) -> None:
    assert kept_tool(kind, endpoint, tool) is kept


def test_server_tools_are_removed_and_named_and_client_tools_kept() -> None:
    body = {
        "model": "claude-x",
        "messages": [{"role": "user", "content": "hi"}],
        "tools": [
            {"name": "lookup", "input_schema": {"type": "object"}},
            {"type": "web_fetch_20250910", "name": "web_fetch"},
            {"type": "bash_20250124", "name": "bash", "allowed_callers": ["code_execution"]},
        ],
        "tool_choice": {"type": "tool", "name": "web_fetch"},
        "mcp_servers": [{"type": "url", "url": "https://mcp.example", "name": "m"}],
        "container": "container_1",
    }
    out, removed = _judge("anthropic", "messages", body)
    assert out["tools"] == [
        {"name": "lookup", "input_schema": {"type": "object"}},
        {"type": "bash_20250124", "name": "bash"},
    ]
    assert out["tool_choice"] == {"type": "auto"}
    assert "mcp_servers" not in out and "container" not in out
    assert set(removed) == {
        "dropped mcp_servers",
        "dropped container",
        "removed tool 'web_fetch_20250910'",
        "dropped allowed_callers of tool 'bash'",
        "tool_choice named a removed tool: auto",
    }
    assert body["tools"][2]["allowed_callers"]  # the caller's object is not changed


@pytest.mark.parametrize(
    ("kind", "endpoint", "choice", "after"),
    [
        ("anthropic", "messages", {"type": "tool", "name": "f"}, {"type": "tool", "name": "f"}),
        ("anthropic", "messages", {"type": "any"}, {"type": "any"}),
        ("anthropic", "messages", {"type": "auto", "disable_parallel_tool_use": True}, None),
        ("anthropic", "messages", {"type": "tool", "name": "web_search"}, {"type": "auto"}),
        ("openai", "chat", "required", "required"),
        ("openai", "chat", {"type": "function", "function": {"name": "f"}}, None),
        ("openai", "chat", {"type": "function", "function": {"name": "gone"}}, "auto"),
        (
            "openai",
            "chat",
            {
                "type": "allowed_tools",
                "allowed_tools": {
                    "mode": "auto",
                    "tools": [{"type": "function", "function": {"name": "gone"}}],
                },
            },
            "auto",
        ),
        ("openai", "responses", {"type": "function", "name": "f"}, None),
        ("openai", "responses", {"type": "web_search_preview"}, "auto"),
        ("openai", "responses", {"type": "mcp", "server_label": "s"}, "auto"),
        (
            "openai",
            "responses",
            {"type": "allowed_tools", "mode": "auto", "tools": [{"type": "function", "name": "f"}]},
            None,
        ),
        (
            "openai",
            "responses",
            {"type": "allowed_tools", "mode": "auto", "tools": [{"type": "file_search"}]},
            "auto",
        ),
    ],
)
def test_a_tool_choice_naming_a_removed_tool_becomes_auto(
    kind: str, endpoint: str, choice: object, after: object
) -> None:
    if kind == "anthropic":
        kept: dict[str, Any] = {"name": "f", "input_schema": {}}
        server: dict[str, Any] = {"type": "web_search_20250305", "name": "web_search"}
    elif endpoint == "chat":
        kept, server = {"type": "function", "function": {"name": "f"}}, {"type": "web_search"}
    else:
        kept, server = {"type": "function", "name": "f"}, {"type": "web_search"}
    body = {"model": "gpt-x", "tools": [kept, server], "tool_choice": choice}
    out, _ = _judge(kind, endpoint, body)
    assert out["tools"] == [kept]
    assert out["tool_choice"] == (choice if after is None else after)


def test_with_every_tool_removed_there_are_no_tools_and_no_choice() -> None:
    body = {"model": "gpt-x", "tools": [{"type": "web_search"}], "tool_choice": "required"}
    out, removed = _judge("openai", "responses", body)
    assert "tools" not in out and "tool_choice" not in out
    assert "removed tool 'web_search'" in removed


def test_web_search_options_are_dropped() -> None:
    body = {"model": "gpt-x", "messages": [], "web_search_options": {}}
    out, removed = _judge("openai", "chat", body)
    assert "web_search_options" not in out and removed == ("dropped web_search_options",)


IMAGE_URL = {"type": "image", "source": {"type": "url", "url": "https://x.example/a.png"}}
DATA = "data:image/png;base64,iVBORw0KGgo="


@pytest.mark.parametrize(
    ("kind", "endpoint", "field", "rule"),
    [
        (
            "anthropic",
            "messages",
            {"messages": [{"role": "user", "content": [IMAGE_URL]}]},
            "model-fetch",
        ),
        (
            "anthropic",
            "messages",
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {
                                "type": "document",
                                "source": {"type": "url", "url": "https://x/a.pdf"},
                            }
                        ],
                    }
                ]
            },
            "model-fetch",
        ),
        (
            "anthropic",
            "messages",
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {"type": "document", "source": {"type": "file", "file_id": "file_1"}}
                        ],
                    }
                ]
            },
            "model-fetch",
        ),
        (
            "anthropic",
            "messages",
            {
                "messages": [
                    {"role": "user", "content": [{"type": "image", "source": {"type": "new_kind"}}]}
                ]
            },
            "model-fetch",
        ),
        (
            "anthropic",
            "messages",
            {
                "messages": [
                    {"role": "user", "content": [{"type": "container_upload", "file_id": "file_1"}]}
                ]
            },
            "model-fetch",
        ),
        # nested in a tool result, and in the system prompt
        (
            "anthropic",
            "messages",
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {"type": "tool_result", "tool_use_id": "t", "content": [IMAGE_URL]}
                        ],
                    }
                ]
            },
            "model-fetch",
        ),
        ("anthropic", "count_tokens", {"system": [IMAGE_URL], "messages": []}, "model-fetch"),
        (
            "openai",
            "chat",
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [{"type": "image_url", "image_url": {"url": "https://x/a.png"}}],
                    }
                ]
            },
            "model-fetch",
        ),
        (
            "openai",
            "chat",
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [{"type": "image_url", "image_url": {"url": "HTTP://x/a.png"}}],
                    }
                ]
            },
            "model-fetch",
        ),
        (
            "openai",
            "chat",
            {
                "messages": [
                    {"role": "user", "content": [{"type": "file", "file": {"file_id": "file-1"}}]}
                ]
            },
            "model-fetch",
        ),
        (
            "openai",
            "responses",
            {
                "input": [
                    {
                        "role": "user",
                        "content": [{"type": "input_image", "image_url": "https://x/a.png"}],
                    }
                ]
            },
            "model-fetch",
        ),
        (
            "openai",
            "responses",
            {
                "input": [
                    {"role": "user", "content": [{"type": "input_image", "file_id": "file-1"}]}
                ]
            },
            "model-fetch",
        ),
        (
            "openai",
            "responses",
            {
                "input": [
                    {
                        "role": "user",
                        "content": [{"type": "input_file", "file_url": "https://x/a.pdf"}],
                    }
                ]
            },
            "model-fetch",
        ),
        (
            "openai",
            "responses",
            {"input": [{"type": "item_reference", "id": "msg_1"}]},
            "model-fetch",
        ),
        (
            "openai",
            "responses",
            {
                "input": [
                    {
                        "type": "function_call_output",
                        "call_id": "c",
                        "output": [{"type": "input_image", "image_url": "https://x/a.png"}],
                    }
                ]
            },
            "model-fetch",
        ),
        ("openai", "responses", {"input": "hi", "prompt": {"id": "pmpt_1"}}, "model-fetch"),
        ("openai", "responses", {"input": "hi", "conversation": "conv_1"}, "model-fetch"),
        (
            "openai",
            "responses",
            {"input": "hi", "previous_response_id": "resp_other"},
            "model-foreign-id",
        ),
        ("openai", "responses", {"input": "hi", "previous_response_id": 7}, "model-foreign-id"),
    ],
)
def test_a_field_the_provider_would_fetch_is_refused(
    kind: str, endpoint: str, field: dict[str, Any], rule: str
) -> None:
    with pytest.raises(BodyRefused) as caught:
        _judge(kind, endpoint, {"model": "claude-x", **field})
    assert caught.value.rule == rule


@pytest.mark.parametrize(
    ("kind", "endpoint", "field"),
    [
        (
            "anthropic",
            "messages",
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {
                                "type": "image",
                                "source": {
                                    "type": "base64",
                                    "media_type": "image/png",
                                    "data": "iVBO",
                                },
                            }
                        ],
                    }
                ]
            },
        ),
        (
            "anthropic",
            "messages",
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {
                                "type": "document",
                                "source": {"type": "text", "media_type": "text/plain", "data": "x"},
                            }
                        ],
                    }
                ]
            },
        ),
        # a tool call's own arguments may name anything: they are the model's, not a fetch
        (
            "anthropic",
            "messages",
            {
                "messages": [
                    {
                        "role": "assistant",
                        "content": [
                            {
                                "type": "tool_use",
                                "id": "t",
                                "name": "f",
                                "input": {"file_id": "x", "image_url": "https://x"},
                            }
                        ],
                    }
                ]
            },
        ),
        # a tool's schema may have a property called file_id
        (
            "anthropic",
            "messages",
            {
                "tools": [
                    {"name": "f", "input_schema": {"properties": {"file_id": {"type": "string"}}}}
                ]
            },
        ),
        (
            "openai",
            "chat",
            {
                "messages": [
                    {"role": "user", "content": [{"type": "image_url", "image_url": {"url": DATA}}]}
                ]
            },
        ),
        (
            "openai",
            "responses",
            {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": DATA}]}]},
        ),
        ("openai", "responses", {"input": "hi", "previous_response_id": "resp_mine"}),
        ("openai", "embeddings", {"input": ["a", "b"]}),
    ],
)
def test_inline_content_and_this_sandboxs_own_response_pass(
    kind: str, endpoint: str, field: dict[str, Any]
) -> None:
    body = {"model": "gpt-x", **field}
    out, removed = _judge(kind, endpoint, body, frozenset({"resp_mine"}))
    assert out == body and removed == ()


@pytest.mark.parametrize("model", [None, "", "gpt-y", 7, ["gpt-x"]])
def test_a_model_the_rule_does_not_list_is_refused(model: object) -> None:
    with pytest.raises(BodyRefused) as caught:
        _judge("openai", "chat", {"model": model, "messages": []})
    assert caught.value.rule == "model-name"


def test_the_model_is_judged_last_and_its_refusal_names_what_was_removed() -> None:
    """What `lnk sandbox check` relies on: a model no rule lists is never forwarded, and the
    refusal shows the server tool was removed first (and a URL refused before it)."""
    body = {"model": "lnk-check-not-a-model", "tools": [{"type": "web_search_20250305"}]}
    with pytest.raises(BodyRefused) as caught:
        _judge("anthropic", "messages", body)
    assert caught.value.rule == "model-name"
    assert "removed tool 'web_search_20250305'" in caught.value.reason
    with pytest.raises(BodyRefused) as caught:
        _judge("anthropic", "messages", {**body, "system": [IMAGE_URL]})
    assert caught.value.rule == "model-fetch"


def test_the_unsafe_switch_keeps_every_tool_and_says_so() -> None:
    body = {"model": "gpt-x", "tools": [{"type": "web_search"}]}
    out, removed = judge_body(
        "openai", "responses", body, MODELS.__contains__, NONE_ISSUED, keep_tools=True
    )
    assert out["tools"] == [{"type": "web_search"}]
    assert removed == ("kept every tool: unsafe_keep_server_tools",)


def test_a_type_that_is_not_a_name_is_judged_not_crashed_on() -> None:
    body = {"model": "gpt-x", "input": [{"type": ["tool_use"], "input": {"file_id": "f"}}]}
    with pytest.raises(BodyRefused):  # not a call block: its `input` is content, and judged
        _judge("openai", "responses", body)
    out, _ = _judge("openai", "responses", {"model": "gpt-x", "input": [{"type": {"a": 1}}]})
    assert out["input"] == [{"type": {"a": 1}}]


@pytest.mark.parametrize("shape", [{"a": 1}, ["base64"], 7, None])
def test_a_source_type_that_is_not_a_name_is_refused_not_crashed_on(shape: object) -> None:
    """Found by the fast form's fuzz (session 11): a `source.type` of an object or a list
    raised TypeError (unhashable, looked up in a frozenset), not the rule's refusal."""
    block = {"type": "image", "source": {"type": shape, "data": "AA=="}}
    body = {"model": "claude-x", "messages": [{"role": "user", "content": [block]}]}
    with pytest.raises(BodyRefused) as refused:
        _judge("anthropic", "messages", body)
    assert refused.value.rule == "model-fetch"
