#!/usr/bin/env python3
"""broca-mcp through a real MCP client that nobody here wrote: the official MCP Python SDK's
stdio client (`mcp.client.stdio.stdio_client` + `mcp.ClientSession`), against a running rig
(`scripts/rig up`: the subc daemon supervising broca, broca-mock as the model provider).

    python scripts/mcp-check.py BROCA_MCP_BINARY

Environment: SUBC_CONNECTION_FILE (the rig's), BROCA_MOCK_MODEL, and BROCA_MOCK_URL or the
rig's run/mock.out to install mock scripts. Prints one line per check; the last line is
`MCP OK <n> checks`, or the first failure (exit 1).
"""

import asyncio
import json
import os
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.shared import exceptions as mcp_exceptions

# SDK 2.x spells it MCPError, 1.x McpError.
MCPError = getattr(mcp_exceptions, "MCPError", None) or getattr(mcp_exceptions, "McpError")

TOOLS = {"broca_send", "broca_wait", "broca_read", "broca_status", "broca_cancel"}
HANDSHAKE_VERSIONS = {"2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25"}
STEP = 30.0  # the longest any one call may take

checks = 0


class Failure(Exception):
    pass


def check(cond, what, detail=""):
    global checks
    if not cond:
        raise Failure(f"{what}: {detail}")
    checks += 1
    print(f"ok {checks} - {what}", flush=True)


def attr(obj, *names, default=None):
    """A field under its SDK 2.x (snake_case) or 1.x (camelCase) name."""
    for n in names:
        if hasattr(obj, n):
            return getattr(obj, n)
    return default


def mock_url():
    url = os.environ.get("BROCA_MOCK_URL")
    if url:
        return url
    rig = Path(os.environ["SUBC_CONNECTION_FILE"]).parent.parent
    for line in (rig / "run" / "mock.out").read_text().splitlines():
        if line.startswith("BROCA_MOCK_URL="):
            return line.split("=", 1)[1]
    raise Failure("no BROCA_MOCK_URL and none in the rig's run/mock.out")


def install(script):
    req = urllib.request.Request(
        mock_url() + "/_mock/lanes/default/script",
        data=json.dumps(script).encode(),
        headers={"content-type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(req, timeout=10) as r:
        if r.status != 204:
            raise Failure(f"the mock refused a script: {r.status}")


def answer(result):
    """A tool result's answer: structuredContent, else the JSON in its text content."""
    structured = attr(result, "structured_content", "structuredContent")
    if structured is not None:
        return structured
    return json.loads(attr(result, "content")[0].text)


async def call(session, name, args, **kw):
    result = await asyncio.wait_for(session.call_tool(name, args, **kw), STEP)
    return result, answer(result)


async def scenario(binary, project_root):
    model = os.environ.get("BROCA_MOCK_MODEL", "mock/echo-chat")
    params = StdioServerParameters(
        command=binary,
        args=["--subc", os.environ["SUBC_CONNECTION_FILE"]],
        env={"CK_LOG": os.environ.get("CK_LOG", "warn")},
        cwd=project_root,
    )
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write) as session:
            init = await asyncio.wait_for(session.initialize(), STEP)
            version = attr(init, "protocol_version", "protocolVersion")
            check(version in HANDSHAKE_VERSIONS, "initialize negotiates a protocol version", version)
            info = attr(init, "server_info", "serverInfo")
            check(info.name == "broca-mcp", "the server names itself", info.name)
            caps = attr(init, "capabilities")
            check(attr(caps, "tools") is not None, "the server declares tools")

            await asyncio.wait_for(session.send_ping(), STEP)
            check(True, "ping answers")

            listed = await asyncio.wait_for(session.list_tools(), STEP)
            names = {t.name for t in listed.tools}
            check(names == TOOLS, "tools/list lists the five tools", sorted(names))
            for t in listed.tools:
                schema = attr(t, "input_schema", "inputSchema")
                if schema.get("type") != "object" or schema.get("additionalProperties") is not False:
                    raise Failure(f"{t.name}: its input schema is not a closed object: {schema}")
                if not t.description or "session" not in schema.get("properties", {}):
                    raise Failure(f"{t.name}: no description or no session property")
            check(True, "every input schema is a closed object with a description and a session")

            # A run whose text streams in paced deltas, so the wait sees it live.
            pieces = ["Streaming ", "through ", "the MCP ", "adapter."]
            events = []
            for p in pieces:
                events += [{"text": p}, {"delay_ms": 150}]
            install({"responses": [{"events": events + [{"usage": {"input": 5, "output": 4}}, {"finish": "stop"}]}]})
            session_name = f"mcp-check-{os.getpid()}"
            res, sent = await call(session, "broca_send", {"session": session_name, "prompt": "stream, please", "model": model})
            check(not attr(res, "is_error", "isError") and sent.get("state") == "active", "broca_send starts a run", sent)
            check(sent.get("send_id_minted") is True and sent.get("send_id"), "a send without send_id gets one minted and reported", sent)
            run_id = sent["run_id"]

            timeline = []

            async def on_progress(progress, total, message):
                timeline.append(("progress", progress, message))

            res, waited = await call(
                session, "broca_wait", {"session": session_name, "run_id": run_id, "timeout_ms": 20000},
                progress_callback=on_progress,
            )
            timeline.append(("result", None, None))
            check(waited.get("outcome") == "finished" and waited["result"]["state"] == "completed",
                  "broca_wait returns run.result once the run finished", waited)
            final = waited["result"]["final_message"]["text"]
            check(final == "".join(pieces), "the result carries the run's final text", final)
            progress = [m for kind, _, m in timeline if kind == "progress"]
            check(len(progress) >= 2, "the run's text arrived as several progress notifications", progress)
            check(timeline[-1][0] == "result" and all(k == "progress" for k, _, _ in timeline[:-1]),
                  "every progress notification arrived before the result", timeline)
            streamed = "".join(m or "" for m in progress)
            check(streamed and final.endswith(streamed), "the streamed text is the run's text", streamed)
            numbers = [p for k, p, _ in timeline if k == "progress"]
            check(numbers == sorted(numbers) and len(set(numbers)) == len(numbers), "progress increases", numbers)

            res, again = await call(session, "broca_send", {"session": session_name, "prompt": "stream, please",
                                                            "model": model, "send_id": sent["send_id"]})
            check(again.get("run_id") == run_id and again.get("send_id_minted") is False,
                  "a retry with the reported send_id answers the same run, never a second one", again)

            res, page = await call(session, "broca_read", {"session": session_name})
            texts = [json.dumps(m["message"]) for m in page["messages"]]
            check(any("stream, please" in t for t in texts) and any("adapter." in t for t in texts),
                  "broca_read pages the transcript", texts)
            check(all(isinstance(m["ordinal"], str) for m in page["messages"]) and isinstance(page["head"]["wal_seq"], str),
                  "ordinals and cursors are decimal strings", page["head"])

            res, status = await call(session, "broca_status", {"session": session_name, "run_id": run_id})
            check(status.get("state") == "completed" and isinstance(status["usage"]["steps"], str),
                  "broca_status answers run.status", status)

            # Cancel a running turn: a reply that stalls after its first words.
            install({"responses": [{"events": [{"text": "I will take a while"}, {"delay_ms": 20000}, {"text": "..."}, {"finish": "stop"}]}]})
            res, sent = await call(session, "broca_send", {"session": session_name, "prompt": "take your time", "model": model})
            slow = sent["run_id"]
            deadline = time.monotonic() + STEP
            while True:
                res, status = await call(session, "broca_status", {"session": session_name, "run_id": slow})
                if status.get("state") == "active" and "step" in status:
                    break
                if time.monotonic() > deadline:
                    raise Failure(f"the slow run never reached its model step: {status}")
                await asyncio.sleep(0.1)
            res, waited = await call(session, "broca_wait", {"session": session_name, "run_id": slow, "timeout_ms": 300})
            check(waited.get("outcome") == "timed_out" and waited["status"]["state"] == "active",
                  "a bounded wait on a running turn times out with its status", waited)
            res, cancelled = await call(session, "broca_cancel", {"session": session_name, "run_id": slow})
            check(cancelled == {"result": "ack"}, "broca_cancel acknowledges a running turn", cancelled)
            res, waited = await call(session, "broca_wait", {"session": session_name, "run_id": slow, "timeout_ms": 20000})
            check(waited.get("outcome") == "finished" and waited["result"]["state"] == "cancelled",
                  "the cancelled run ends cancelled", waited)
            res, again = await call(session, "broca_cancel", {"session": session_name, "run_id": slow})
            check(again == {"result": "not_active"}, "cancelling it again answers not_active", again)

            res, refused = await call(session, "broca_send", {"session": session_name, "prompt": "x", "model": model, "title": "   "})
            check(attr(res, "is_error", "isError") is True and refused.get("code") == "invalid_params"
                  and refused.get("detail", {}).get("field") == "title",
                  "a broca refusal is an isError result with broca's code and detail", refused)

            res, refused = await call(session, "broca_read", {"session": session_name, "limit": "0"})
            check(attr(res, "is_error", "isError") is True and refused.get("code") == "invalid_params",
                  "broca_read's refusal comes back verbatim", refused)

            try:
                await asyncio.wait_for(session.call_tool("broca_nope", {}), STEP)
                raise Failure("an unknown tool was answered")
            except MCPError as e:
                check(attr(e, "error").code == -32602, "an unknown tool is a JSON-RPC error", e)


def main():
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    binary = sys.argv[1]
    with tempfile.TemporaryDirectory(prefix="mcp-check-") as root:
        try:
            asyncio.run(scenario(binary, os.path.realpath(root)))
        except Failure as e:
            print(f"MCP FAILED after {checks} checks: {e}", flush=True)
            return 1
        except Exception as e:  # noqa: BLE001 - any SDK or transport error fails the check
            print(f"MCP FAILED after {checks} checks: {type(e).__name__}: {e}", flush=True)
            return 1
    print(f"MCP OK {checks} checks", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
