"""Drives ferry's QMP socket with QEMU's own client library, qemu.qmp:
negotiation, queries, parameters and capabilities, an unknown command, a
migration followed by its events to completed, query-migrate after it, and
quit. Prints one JSON line of what it saw; exits non-zero on any surprise.

usage: qmp_client.py SOURCE_QMP_SOCKET DESTINATION_ADDR
"""

import asyncio
import json
import sys

from qemu.qmp import EventListener, ExecuteError, QMPClient


async def main(sock: str, dest: str) -> dict:
    qmp = QMPClient("ferry-test")
    await qmp.connect(sock)  # reads the greeting, negotiates capabilities
    seen = {"greeting": qmp.greeting is not None}

    status = await qmp.execute("query-status")
    assert status["status"] == "running", status
    version = await qmp.execute("query-version")
    assert version["package"].startswith("ferry"), version
    commands = {c["name"] for c in await qmp.execute("query-commands")}
    assert {"migrate", "query-migrate", "quit"} <= commands, commands

    await qmp.execute("migrate-set-parameters", {"downtime-limit": 300})
    params = await qmp.execute("query-migrate-parameters")
    assert params["downtime-limit"] == 300, params
    await qmp.execute(
        "migrate-set-capabilities",
        {"capabilities": [{"capability": "auto-converge", "state": True}]},
    )

    try:
        await qmp.execute("query-cpus-fast")
        raise AssertionError("an unknown command was answered")
    except ExecuteError as e:
        seen["unknown_command"] = e.error_class
        assert e.error_class == "CommandNotFound", e

    statuses = []
    listener = EventListener(names=["MIGRATION"])
    with qmp.listen(listener):
        await qmp.execute("migrate", {"uri": f"tcp:{dest}"})
        async for event in listener:
            statuses.append(event["data"]["status"])
            if event["data"]["status"] in ("completed", "failed", "cancelled"):
                break
    seen["statuses"] = statuses
    assert statuses[-1] == "completed", statuses

    after = await qmp.execute("query-migrate")
    assert after["status"] == "completed", after
    seen["digest_match"] = after["x-ferry-summary"]["digest_match"]
    assert seen["digest_match"] is True, after
    post = await qmp.execute("query-status")
    seen["run_state_after"] = post["status"]
    assert post["status"] == "postmigrate", post

    # A moved VM cannot migrate again, and the record stays as it was.
    try:
        await qmp.execute("migrate", {"uri": f"tcp:{dest}"})
        raise AssertionError("a moved VM was migrated again")
    except ExecuteError as e:
        assert e.error_class == "GenericError", e
    again = await qmp.execute("query-migrate")
    assert again["status"] == "completed", again
    assert (await qmp.execute("query-status"))["status"] == "postmigrate"

    await qmp.execute("quit")
    await qmp.disconnect()
    return seen


if __name__ == "__main__":
    result = asyncio.run(main(sys.argv[1], sys.argv[2]))
    print(json.dumps(result))
