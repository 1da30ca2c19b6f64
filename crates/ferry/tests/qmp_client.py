"""Drives ferry's QMP socket with QEMU's own client library, qemu.qmp:
negotiation, queries, parameters and capabilities, an unknown command, stop
and cont, a migration followed by its events to completed, query-migrate
after it, and quit. On the destination's QMP socket, connected before the
migration starts as libvirt connects to QEMU's: run state inmigrate, and
its MIGRATION events followed to completed. Prints one JSON line of what it
saw; exits non-zero on any surprise.

usage: qmp_client.py SOURCE_QMP_SOCKET DESTINATION_ADDR DESTINATION_QMP_SOCKET
"""

import asyncio
import json
import sys

from qemu.qmp import EventListener, ExecuteError, QMPClient


async def dest_events(dqmp: QMPClient, listener: EventListener) -> list:
    """The destination's MIGRATION statuses, until a final one."""
    statuses = []
    async for event in listener:
        statuses.append(event["data"]["status"])
        if event["data"]["status"] in ("completed", "failed", "cancelled"):
            break
    return statuses


async def main(sock: str, dest: str, dest_sock: str) -> dict:
    qmp = QMPClient("ferry-test")
    await qmp.connect(sock)  # reads the greeting, negotiates capabilities
    seen = {"greeting": qmp.greeting is not None}

    # The destination's monitor, up before anything arrives.
    dqmp = QMPClient("ferry-test-destination")
    await dqmp.connect(dest_sock)
    arriving = await dqmp.execute("query-status")
    seen["destination_before"] = arriving["status"]
    assert arriving["status"] == "inmigrate" and not arriving["running"], arriving
    dlistener = EventListener(names=["MIGRATION"])
    dqmp.register_listener(dlistener)
    dwatch = asyncio.create_task(dest_events(dqmp, dlistener))

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

    await qmp.execute("stop")
    paused = await qmp.execute("query-status")
    assert paused["status"] == "paused" and not paused["running"], paused
    await qmp.execute("cont")
    assert (await qmp.execute("query-status"))["status"] == "running"

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

    seen["destination_statuses"] = await asyncio.wait_for(dwatch, 60)
    assert seen["destination_statuses"][-1] == "completed", seen
    dqmp.remove_listener(dlistener)
    arrived = await dqmp.execute("query-status")
    seen["destination_after"] = arrived["status"]
    assert arrived["status"] == "running" and arrived["running"], arrived
    await dqmp.disconnect()

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
    result = asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3]))
    print(json.dumps(result))
