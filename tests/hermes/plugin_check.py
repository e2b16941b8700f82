"""Hermes's own plugin loader and tool dispatch, on a HERMES_HOME where
`recall hermes install` ran (no LLM involved).

Usage: plugin_check.py HERMES_HOME QUERY
Prints one JSON object: whether Hermes loaded the plugin, whether the tool is
registered in the session_search toolset and offered to the model, the
tool's answer to QUERY through `model_tools.handle_function_call`, its
answers to queries that look like options or exceed a command line, its
answer to bad arguments, and whether the post_llm_call hook ran.
"""
import json
import os
import sys

home, query = sys.argv[1], sys.argv[2]
os.environ["HERMES_HOME"] = home  # before any Hermes import

import model_tools  # noqa: E402  (loads the built-in tools and the plugins)
from hermes_cli.plugins import get_plugin_manager, invoke_hook  # noqa: E402
from tools.registry import registry  # noqa: E402

out = {}
plugins = {p["key"]: p for p in get_plugin_manager().list_plugins()}
recall = plugins.get("recall")
out["loaded"] = bool(recall and recall.get("enabled") and not recall.get("error"))
out["plugin_error"] = recall.get("error") if recall else None
entry = registry.get_entry("semantic_session_search")
out["registered"] = entry is not None
out["toolset"] = entry.toolset if entry else None
defs = model_tools.get_tool_definitions(enabled_toolsets=["session_search"], quiet_mode=True)
out["offered"] = any(d["function"]["name"] == "semantic_session_search" for d in defs)
if entry is not None:
    out["result"] = json.loads(
        model_tools.handle_function_call(
            "semantic_session_search", {"query": query, "limit": 3}, task_id="t1", session_id="s1"
        )
    )
    # Queries that look like options, and one longer than a command line may be.
    out["hostile"] = {
        label: json.loads(
            model_tools.handle_function_call("semantic_session_search", {"query": q, "limit": 3})
        )
        for label, q in [
            ("dash", "-5 degrees celsius"),
            ("help", "--help"),
            ("option", "--index=/etc/passwd"),
            ("long", "disk space " * 20000),
        ]
    }
    out["no_query"] = json.loads(model_tools.handle_function_call("semantic_session_search", {}))
    out["bad_limit"] = json.loads(
        model_tools.handle_function_call("semantic_session_search", {"query": "x", "limit": "many"})
    )
    results = invoke_hook(
        "post_llm_call", session_id="s1", task_id="t1", turn_id="u1", user_message="hi",
        assistant_response="hello", conversation_history=[], model="m", platform="cli",
    )
    out["hook_ran"] = True
    out["hook_results"] = [r for r in results if r is not None]
print(json.dumps(out))
