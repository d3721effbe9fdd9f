"""What a hosted model's request body may ask for (kinds `anthropic` and `openai`): the model in
the rule's allowlist, only client tools, no URL or stored object the provider would fetch with
the owner's key. Pure: a parsed JSON object in (`strict_json.loads`), the object to forward and
the list of what was removed out; a refusal raises `BodyRefused`.

Tools are an allowlist of shapes, never a blocklist (providers ship new server tools every few
months). Kept: a tool the client itself runs.
- Anthropic (`anthropic.types.beta.BetaToolUnionParam`): no `type` or `custom` (a client tool),
  and the caller-executed `bash_*`, `text_editor_*`, `computer_*`, `memory_*` (each `_YYYYMMDD`).
- OpenAI chat (`ChatCompletionToolUnionParam`): `function`, `custom`. Responses
  (`responses.ToolParam`): `function`, `custom`, `computer*`, `local_shell`, `apply_patch`, and
  `shell` with no environment or a `local` one (a container environment runs at OpenAI).
Every other entry (web search, web fetch, code execution, MCP, file search, image generation,
tool search, toolsets, whatever ships next) is removed and named in the removals; `mcp_servers`,
`container`, `web_search_options` and each tool's `allowed_callers` are dropped; a `tool_choice`
naming a removed tool (or none left) becomes auto.

Refused (`model-fetch`), in the content the model reads (`messages`, `system`, `input`,
`instructions`; a tool call's own arguments are not looked into): a `source` whose `type` is not
inline data (`url`, `file`, anything new), any `file_id` or `file_url`, an `image_url` that is not
a `data:` URL, an `item_reference`; at the top: a stored `prompt`, a `conversation`, and a
`previous_response_id` not issued to this sandbox (`model-foreign-id`). Refused (`model-name`):
a model the rule does not list, or none.

The content as the client's bytes (the fast form, decided in session 11 for issue 18's 1 MiB
target: msgspec's parse of ~3000 small blocks alone cost more than the 1 ms). When the C pass
(lnk_proxy/native/json_scan.c, `strict_json.read(content_as_bytes=True)`) proves, over every
key and every `type` value at every depth of each top-level content member (`CONTENT_KEYS`, a
key matched as written), that nothing this module judges is there, that member is forwarded as
the validated bytes (a `msgspec.Raw`) inside the proxy's own serialisation of the rest, which is
parsed and judged as always; anything else takes the full parse. "Nothing judged": no key that
is one of `FETCH_NAMES` (compared decoded) and no key spelt with an escape; every `type` a plain
string, unescaped, one of `PLAIN_TYPES` (so no `item_reference`, no server tool's block, no
`type` that ships next); every number at most 15 characters with no exponent (so every parser
reads the same double, and msgspec would not refuse it). That covers all `_judge_block` and the
walk look at: the walk's only judgements are those keys and that one `type` value (a tool's
call's own `input` is screened too, where the walk skips it: only stricter).
What it gives up: the content is not re-serialised; the upstream reads the client's spelling
of it, byte for byte (its whitespace, its escapes, `1.50` for `1.5`). Why that is safe: the pass
validates the whole body strictly (RFC 8259 grammar, UTF-8 with no overlong form or encoded
surrogate, every escape one of the nine, no lone surrogate escape, nesting <= MAX_DEPTH, values
<= MAX_VALUES, no key twice in any object compared decoded), so every conforming parser reads
the same value from those bytes; a duplicate key is refused, so which one an upstream parser
keeps cannot matter; and the bytes it parses are the very bytes the screen proved hold no judged
name under any spelling. What it keeps: every verdict is the full parse's (the fast form is
taken only where that parse would forward the content unchanged). `lnk sandbox check` tries
these spellings (`plan_fast_form`); the proxy's test-only `unsafe_naive_content_screen` swaps
the strict pass for a naive screen of the bytes as written (`unsafe_naive_screen`), and check
must then report them `leaked`.

Security limitations: this does NOT look at what the prompt says (a sandbox may send the model
whatever it can read: the seed says so), nor at a kept tool's definition, and does NOT stop the
model's own output (tool calls) from asking the sandbox to do things: the sandbox's wall judges
those. A content field that names a URL under a new name is not known here.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Container
from typing import Any

import msgspec

from lnk_proxy.strict_json import BodyRefused

__all__ = [
    "CONTENT_KEYS",
    "DROPPED_KEYS",
    "FETCH_NAMES",
    "INLINE_SOURCES",
    "PLAIN_TYPES",
    "judge_body",
    "kept_tool",
    "may_fetch",
]

# Top-level and per-tool keys that hand the provider a server, a container or a caller to run
# code for the model: dropped wherever they appear at those levels.
DROPPED_KEYS = ("mcp_servers", "container", "web_search_options", "allowed_callers")
# A content block's `source.type` that carries its bytes inline (never a fetch).
INLINE_SOURCES = frozenset({"base64", "text", "content"})
_ANTHROPIC_CLIENT_TOOL = re.compile(r"(bash|text_editor|computer|memory)_[0-9]{8}")
_OPENAI_CHAT_TOOLS = frozenset({"function", "custom"})
_OPENAI_RESPONSES_TOOLS = frozenset({"function", "custom", "local_shell", "apply_patch"})
# The content the model reads, walked for fetches; the C pass knows the same four, in this order.
CONTENT_KEYS = ("messages", "system", "input", "instructions")
# The `type` values a content member may hold and still be forwarded as the client's bytes
# (the module's docstring): the plain blocks of a conversation. Any other value (a server
# tool's block, an `item_reference`, whatever ships next) sends the body down the full parse.
PLAIN_TYPES = (
    "text",
    "tool_use",
    "tool_result",
    "thinking",
    "redacted_thinking",
    "ephemeral",
    "message",
    "input_text",
    "output_text",
    "function",
    "function_call",
    "function_call_output",
    "reasoning",
    "summary_text",
    "refusal",
)
# Blocks whose `input`/`arguments` are the model's own call: judged by the sandbox, not here.
_CALL_BLOCKS = frozenset({"tool_use", "server_tool_use", "mcp_tool_use"})
_CONTAINERS = (dict, list)  # what the parse makes
# Every key `_judge_block` refuses a block by, and the one `type` value it refuses: a body
# with none of them as a string is not walked (`may_fetch`).
FETCH_NAMES = ("file_id", "file_url", "source", "image_url", "item_reference")
_FETCH_STRING = re.compile(b'"(?:' + b"|".join(n.encode() for n in FETCH_NAMES) + b')"')
_MAX_NAME_SHOWN = 64  # a removed tool's type or name in the wire log


def kept_tool(kind: str, endpoint: str, tool: object) -> bool:
    """Whether `tool` is a client tool of `kind`'s `endpoint` (see the module's docstring)."""
    if not isinstance(tool, dict):
        return False
    shape = tool.get("type")
    if shape is not None and not isinstance(shape, str):
        return False  # a list or an object where a name goes: no client tool's shape
    if kind == "anthropic":
        return shape in (None, "custom") or (
            isinstance(shape, str) and _ANTHROPIC_CLIENT_TOOL.fullmatch(shape) is not None
        )
    if endpoint == "chat":
        return shape in _OPENAI_CHAT_TOOLS
    if not isinstance(shape, str):
        return False
    if shape == "shell":
        environment = tool.get("environment")
        return environment is None or (
            isinstance(environment, dict) and environment.get("type") == "local"
        )
    return shape in _OPENAI_RESPONSES_TOOLS or shape.startswith("computer")


def judge_body(
    kind: str,
    endpoint: str,
    body: dict[str, Any],
    allows_model: Callable[[str], bool],
    issued: Container[str],
    *,
    keep_tools: bool = False,
    canonical: bytes | None = None,
    fetch_seen: bool | None = None,
) -> tuple[dict[str, Any], tuple[str, ...]]:
    """(the body to forward, what was removed) for `endpoint` ("messages", "count_tokens",
    "chat", "responses", "embeddings"); BodyRefused naming the first thing refused.
    `keep_tools` (the proxy's `unsafe_keep_server_tools`, tests only) keeps every tool, so
    `lnk sandbox check` can show that class leak. `canonical` is `strict_json.Parsed`'s
    serialisation of `body`: when none of `FETCH_NAMES` is a string in it, no block can be
    refused as a fetch and the content is not walked. `fetch_seen` is `Parsed.fetch_seen`, the
    C pass's own screen of every string of the client's bytes for those names: when it is not
    None it is used instead of screening `canonical` again."""
    out = dict(body)
    removed = [f"dropped {key}" for key in DROPPED_KEYS if out.pop(key, None) is not None]
    _refuse_references(kind, out, issued)
    if fetch_seen if fetch_seen is not None else may_fetch(canonical):
        for key in CONTENT_KEYS:
            # a Raw is content the C pass proved plain (strict_json makes one only then)
            if key in out and type(out[key]) is not msgspec.Raw:
                _refuse_fetches(out[key])
    if "tools" in out and keep_tools:
        removed.append("kept every tool: unsafe_keep_server_tools")
    elif "tools" in out:
        removed += _filter_tools(kind, endpoint, out)
    # Last, and naming what was removed: `lnk sandbox check` sends a model no rule lists, so
    # nothing is ever forwarded, and reads in this refusal that the body was judged whole.
    model = out.get("model")
    if not isinstance(model, str) or not allows_model(model):
        shown = _shown(model) if isinstance(model, str) else "no model"
        after = f" (judged: {'; '.join(removed)})" if removed else ""
        raise BodyRefused(f"{shown} is not in the rule's models{after}", "model-name")
    return out, tuple(removed)


def may_fetch(canonical: bytes | None) -> bool:
    """Whether a body's serialisation could hold a block `_judge_block` refuses (True when
    there is none to look at). In the encoder's compact output a string is its characters
    between quotes, only `"`, `\\` and control characters escaped, so a key or value that
    is exactly one of `FETCH_NAMES` (none has a character to escape) is always the bytes
    `"name"` in it; a quoted name inside a longer string may match too, which costs only the
    walk."""
    return canonical is None or _FETCH_STRING.search(canonical) is not None


def _refuse_references(kind: str, body: dict[str, Any], issued: Container[str]) -> None:
    """Stored objects at the top level: prompts, conversations, other sandboxes' responses."""
    if kind != "openai":
        return
    if body.get("prompt") is not None:
        raise BodyRefused("a stored prompt template (prompt): send the text itself", "model-fetch")
    if body.get("conversation") is not None:
        raise BodyRefused("a stored conversation: send previous_response_id", "model-fetch")
    previous = body.get("previous_response_id")
    if previous is not None and (not isinstance(previous, str) or previous not in issued):
        raise BodyRefused(
            "previous_response_id names a response this sandbox was not given", "model-foreign-id"
        )


def _refuse_fetches(content: object) -> None:
    """BodyRefused at the first field in `content` that makes the provider fetch or read
    something stored (iterative: nesting is bounded by strict_json, not by the stack)."""
    stack = [content]
    while stack:
        item = stack.pop()
        if type(item) is list:
            stack += [v for v in item if type(v) is dict or type(v) is list]
            continue
        if type(item) is not dict:
            continue
        shape = item.get("type")
        _judge_block(shape, item)
        if (
            type(shape) is str and shape in _CALL_BLOCKS
        ):  # the model's own call's arguments: not content it fetches
            stack += [v for k, v in item.items() if k != "input" and type(v) in _CONTAINERS]
        else:
            stack += [v for v in item.values() if type(v) is dict or type(v) is list]


def _judge_block(shape: object, block: dict[str, Any]) -> None:
    for key in ("file_id", "file_url"):
        if block.get(key) is not None:
            raise BodyRefused(
                f"{key}: a stored file or a URL the provider would read", "model-fetch"
            )
    if shape == "item_reference":
        raise BodyRefused("item_reference: an item stored at the provider", "model-fetch")
    source = block.get("source")
    inline = isinstance(source, dict) and source.get("type")
    if isinstance(source, dict) and not (isinstance(inline, str) and inline in INLINE_SOURCES):
        shown = _shown(source.get("type"))
        raise BodyRefused(f"source.type {shown}: send the bytes inline (base64)", "model-fetch")
    image = block.get("image_url")
    url = image.get("url") if isinstance(image, dict) else image
    if image is not None and not (isinstance(url, str) and url.startswith("data:")):
        raise BodyRefused(
            "image_url: only a data: URL (the provider would fetch it)", "model-fetch"
        )


def _filter_tools(kind: str, endpoint: str, body: dict[str, Any]) -> list[str]:
    """Keep client tools only; the choice follows what is left. The removals, as logged."""
    tools = body["tools"]
    if not isinstance(tools, list):
        raise BodyRefused("tools: expected a list")
    kept, removed = [], []
    for tool in tools:
        if kept_tool(kind, endpoint, tool):
            if "allowed_callers" in tool:
                removed.append(f"dropped allowed_callers of tool {_shown(_tool_name(tool))}")
            kept.append({k: v for k, v in tool.items() if k != "allowed_callers"})
        else:
            shape = tool.get("type") if isinstance(tool, dict) else None
            removed.append(f"removed tool {_shown(shape)}")
    if kept:
        body["tools"] = kept
    else:
        del body["tools"]
    choice = body.get("tool_choice")
    if choice is not None and not _choice_stands(choice, kept):
        if kept:
            body["tool_choice"] = {"type": "auto"} if kind == "anthropic" else "auto"
        else:
            del body["tool_choice"]
        removed.append("tool_choice named a removed tool: auto")
    return removed


def _choice_stands(choice: object, kept: list[dict[str, Any]]) -> bool:
    """Whether a tool_choice still names only kept tools (a plain mode always does, while
    a tool is left)."""
    if not kept:
        return False
    if isinstance(choice, str):
        return choice in ("auto", "none", "required")
    if not isinstance(choice, dict):
        return False
    names = {_tool_name(t) for t in kept} - {None}
    shape = choice.get("type")
    if shape in ("auto", "any", "none", "required") and set(choice) <= {
        "type",
        "disable_parallel_tool_use",
    }:
        return True
    if shape == "allowed_tools":
        allowed = choice.get("allowed_tools", choice)
        entries = allowed.get("tools") if isinstance(allowed, dict) else None
        return isinstance(entries, list) and all(_tool_name(e) in names for e in entries)
    named = _tool_name(choice)
    return named is not None and named in names


def _tool_name(tool: object) -> str | None:
    """A tool's (or a choice's) name: top-level, or under `function`/`custom` (chat)."""
    if not isinstance(tool, dict):
        return None
    for where in (tool, tool.get("function"), tool.get("custom")):
        if isinstance(where, dict) and isinstance(where.get("name"), str):
            return str(where["name"])
    return None


def _shown(value: object) -> str:
    if isinstance(value, str) and value.isprintable():
        return repr(value[:_MAX_NAME_SHOWN])
    return "(none)" if value is None else f"(a {type(value).__name__})"
