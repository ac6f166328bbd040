"""Two group sessions talk through `switchboard mcp` with a real MCP client, and `group_read` is acked.

Run by tests/tests/group_leases.rs: python3 group_read.py BIN HOME_ALICE HOME_BOB. The group
sessions `amber-otter` (alice) and `brave-heron` (bob) exist already (`listen --handle`). One stdio
MCP server per profile: alice invites, bob joins, alice sends, bob's `group_read` returns the
message. Prints a JSON summary on stdout; the caller checks in bob's database that the MCP server
acked the lease the answer came under. Any failed check raises (non-zero exit).
"""

import asyncio
import json
import os
import sys

from mcp import Client, StdioServerParameters

TEXT = "hello over mcp"


def server(binary, home, agent):
    env = {k: os.environ[k] for k in ("TMPDIR", "SWITCHBOARD_LOG", "PATH", "HOME") if k in os.environ}
    env["SWITCHBOARD_KEYSTORE"] = "file"
    return StdioServerParameters(command=binary, args=["--home", home, "mcp", "--agent", agent], env=env)


def result_of(result, name):
    assert not result.is_error, f"{name}: {[getattr(c, 'text', '') for c in result.content]}"
    return result.structured_content["result"]


async def main(binary, home_a, home_b):
    summary = {}
    async with Client(server(binary, home_a, "amber-otter")) as alice, Client(
        server(binary, home_b, "brave-heron")
    ) as bob:
        inv = result_of(await alice.call_tool("group_invite", {}), "group_invite")
        joined = result_of(await bob.call_tool("group_join", {"link": inv["link"]}), "group_join")
        assert joined["group"] == inv["group"], joined
        sent = result_of(await alice.call_tool("group_send", {"group": inv["group"], "text": TEXT}), "group_send")
        found = None
        for _ in range(10):
            got = result_of(await bob.call_tool("group_read", {"timeout_secs": 10}), "group_read")
            found = next((i for i in got["items"] if i["content"] == TEXT), None)
            if found:
                assert got["lease"].startswith("G"), got
                summary["lease"] = got["lease"]
                break
        assert found, "the message never reached bob's group_read"
        assert found["id"] == sent["id"] and found["redelivered"] is False, found
        summary["id"] = found["id"]
        summary["ok"] = True
    print(json.dumps(summary))


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:4]))
