"""recall for Hermes: the `semantic_session_search` tool and real-time indexing.

Installed by `recall hermes install`, which writes `recall.json` beside this
file (the recall binary, the server URL, the Hermes home and profile, the
model). Python standard library only.

- The tool asks a running `recall serve` (fast: the model is warm) and falls
  back to running the `recall` binary. Its answer is recall's `--json`
  results, with `link` and `match_message_id` so that the model can open a
  session with Hermes's own `session_search(session_id=..., around_message_id=...)`.
- A `post_llm_call` hook nudges recall to index the turn that just happened
  (debounced, never blocking the agent): `POST /index` on a server started
  with `--watch`, else a background `recall index`.
- Errors come back as `{"success": false, "error": ...}`, never as exceptions.
"""

import json
import os
import subprocess
import threading
import time
import urllib.error
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
TOOL = "semantic_session_search"
NUDGE_EVERY = 2.0  # seconds between two index nudges

DESCRIPTION = (
    "Search the user's past conversations by MEANING, in any language. Use it instead of "
    "session_search when you do not know the exact words that were used (\"the time the server "
    "ran out of space\" finds a session about disk cleanup), when the user asks in another "
    "language than the conversation was in, or when session_search found nothing. Exact "
    "identifiers (error codes, commands, file names) are found too; so are answers to plain "
    "questions (\"when did I go to the support group?\"). Returns the best sessions with a "
    "snippet of the matching message (the answer, where the match asked a question), `when` it "
    "was written (for questions about dates), `link`, `session_id` and `match_message_id`; to "
    "read one, call session_search(session_id=..., around_message_id=match_message_id)."
)

SCHEMA = {
    "name": TOOL,
    "description": DESCRIPTION,
    "parameters": {
        "type": "object",
        "properties": {
            "query": {
                "type": "string",
                "description": "What to look for, in any language: a question, a description, or an exact identifier.",
            },
            "limit": {"type": "integer", "description": "Sessions to return (1-10, default 5)."},
            "role_filter": {
                "type": "string",
                "description": "Only messages of these roles, comma-separated: user, assistant, tool.",
            },
            "since": {"type": "string", "description": "Only messages at or after this time: YYYY-MM-DD[THH:MM] (UTC), an RFC 3339 time with an offset, or a time ago (7d, 12h, yesterday)."},
            "until": {"type": "string", "description": "Only messages at or before this time."},
            "source": {
                "type": "string",
                "description": "Only sessions from these sources, comma-separated (cli, telegram, discord, cron, ...).",
            },
        },
        "required": ["query"],
    },
}


def _settings():
    try:
        with open(os.path.join(HERE, "recall.json"), encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def _error(message):
    return json.dumps({"success": False, "error": message})


def _post(url, body, timeout):
    request = urllib.request.Request(
        url,
        data=json.dumps(body).encode("utf-8"),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    api_key = os.environ.get("RECALL_API_KEY")
    if api_key:
        request.add_header("Authorization", "Bearer " + api_key)
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return json.loads(response.read().decode("utf-8"))


def _server_up(settings, timeout=0.5):
    server = settings.get("server")
    if not server:
        return False
    try:
        with urllib.request.urlopen(server + "/health", timeout=timeout) as response:
            return response.status == 200
    except (OSError, ValueError):
        return False


def _binary(settings):
    path = settings.get("binary") or "recall"
    if os.path.isabs(path):
        return path if os.access(path, os.X_OK) else None
    for directory in os.environ.get("PATH", "").split(os.pathsep):
        candidate = os.path.join(directory, path)
        if os.access(candidate, os.X_OK):
            return candidate
    return None


def _home_args(settings):
    args = []
    if settings.get("hermes_home"):
        args += ["--hermes-home", settings["hermes_home"]]
    if settings.get("profile") and settings["profile"] != "default":
        args += ["--profile", settings["profile"]]
    return args


def _engine_args(settings):
    """What install was told about the engine: model, dtype, providers, config."""
    args = []
    if settings.get("model"):
        args += ["--model", settings["model"]]
    if settings.get("dtype"):
        args += ["--dtype", settings["dtype"]]
    if settings.get("providers"):
        args += ["--provider", ",".join(settings["providers"])]
    if settings.get("config"):
        args += ["--config", settings["config"]]
    return args


def _search_via_binary(settings, request):
    binary = _binary(settings)
    if binary is None:
        raise RuntimeError("the recall binary was not found (run `recall hermes install` again)")
    command = [binary, "search", "--json", "--limit", str(request["limit"])]
    command += _home_args(settings) + _engine_args(settings)
    for field, flag in (("role_filter", "--role"), ("source", "--source"), ("since", "--since"), ("until", "--until")):
        if request.get(field):
            command += [f"{flag}={request[field]}"]
    # The query goes on standard input: it can never be taken for an
    # option, and no length of it exceeds the command line's limit.
    command += ["--", "-"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, input=request["query"])
    if done.returncode != 0:
        raise RuntimeError(done.stderr.strip() or "recall search failed")
    behind = next((line.strip() for line in done.stderr.splitlines() if line.startswith("note: the index lacks")), None)
    return [json.loads(line) for line in done.stdout.splitlines() if line.strip()], behind


def _check():
    settings = _settings()
    return _server_up(settings) or _binary(settings) is not None


def _handler(args, **kwargs):
    try:
        args = args or {}
        query = str(args.get("query") or "").strip()
        if not query:
            return _error("`query` is required: what to look for")
        try:
            limit = max(1, min(10, int(args.get("limit") or 5)))
        except (TypeError, ValueError):
            return _error("`limit` must be a number from 1 to 10")
        settings = _settings()
        request = {"query": query, "limit": limit}
        for field in ("role_filter", "source", "since", "until"):
            if args.get(field):
                request[field] = str(args[field])
        if settings.get("profile"):
            request["profile"] = settings["profile"]
        results, via, found_by, behind = None, "recall serve", "hybrid", None
        if _server_up(settings):
            try:
                answer = _post(settings["server"] + "/search", request, timeout=60)
                results = answer.get("results", [])
                found_by = answer.get("mode", "hybrid")
            except urllib.error.HTTPError as e:
                detail = e.read().decode("utf-8", "replace")
                try:
                    detail = json.loads(detail).get("error", detail)
                except ValueError:
                    pass
                if e.code == 400:
                    return _error(str(detail))
            except (OSError, ValueError):
                results = None
        if results is None:
            via = "recall binary"
            results, behind = _search_via_binary(settings, request)
            modes = {r.pop("mode", "hybrid") for r in results}
            found_by = "keyword" if "keyword" in modes else "hybrid"
        extra = {}
        if results and all(r.get("weak") for r in results):
            extra["weak_note"] = (
                "every result is weak: nothing in the history stands out as being about this query; "
                "say that it was probably not discussed rather than presenting these as the answer"
            )
        if behind:
            # The newest turns are not searchable yet: the agent should know.
            extra["index_note"] = behind[len("note: "):]
        if found_by == "keyword":
            # The model must not take exact-word matches for a search by meaning.
            extra["note"] = (
                "no embedding provider was available: these are keyword matches only; "
                "a paraphrase of the query may find nothing"
            )
        return json.dumps(
            {
                "success": True,
                "mode": "semantic" if found_by != "keyword" else "keyword",
                **extra,
                "query": query,
                "results": results,
                "count": len(results),
                "via": via,
                "hint": "open a result with session_search(session_id=..., around_message_id=match_message_id); "
                "a result with weak: true holds few of the query's words and is barely closer to it than the "
                "rest of the history: it may not be what the user means; `when` dates the matching message",
            },
            ensure_ascii=False,
        )
    except Exception as e:  # never let an exception escape into Hermes
        return _error(f"recall: {e}")


_nudge_lock = threading.Lock()
_last_nudge = [0.0]
_index_process = [None]


def _nudge():
    settings = _settings()
    if settings.get("server"):
        try:
            _post(settings["server"] + "/index", {}, timeout=1.0)
            return
        except (OSError, ValueError):
            pass
    running = _index_process[0]
    if running is not None and running.poll() is None:
        return
    binary = _binary(settings)
    if binary is None:
        return
    command = [binary, "index", "--json"] + _home_args(settings) + _engine_args(settings)
    _index_process[0] = subprocess.Popen(
        command,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


def _on_post_llm_call(**kwargs):
    """Index the turn that just happened, so the next turn can find it."""
    try:
        with _nudge_lock:
            now = time.monotonic()
            if now - _last_nudge[0] < NUDGE_EVERY:
                return None
            _last_nudge[0] = now
        threading.Thread(target=_nudge, name="recall-nudge", daemon=True).start()
    except Exception:
        pass
    return None


def register(ctx):
    ctx.register_tool(
        name=TOOL,
        toolset="session_search",
        schema=SCHEMA,
        handler=_handler,
        check_fn=_check,
        description=DESCRIPTION,
        emoji="🔎",
    )
    ctx.register_hook("post_llm_call", _on_post_llm_call)
