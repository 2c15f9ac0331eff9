"""The IPMI worker: a child process that runs pyghmi for the controller.

Run as ``python -m metalmend.bmc.ipmi_worker``; speaks JSON lines on stdin/stdout. One
request per line::

    {"id": 7, "op": "state" | "on" | "shutdown" | "off", "host": "10.0.0.9", "port": 623,
     "local": "10.0.0.1", "username": "...", "password": "..."}

first, once its imports are done, the line ``{"ready": true}``; then one answer per line,
in any order::

    {"id": 7, "power": "on" | "off"}   or   {"id": 7, "ok": true}
    {"id": 7, "error": "auth" | "timeout" | "unsupported" | "failed", "message": "..."}

Why a process: pyghmi is blocking, keeps process-wide session state, and a second
``Command`` for a session that never finished logging in waits on it forever (three
hosts with wrong users on one BMC left it "busy" until the controller restarted). The
controller kills this process (SIGKILL) when a call passes its deadline or is cancelled,
which ends every thread and socket of pyghmi at once; nothing lives on.

Requests run in threads of their own, so BMCs pinned to this worker do not wait for each
other; the controller sends at most one call per BMC at a time.

The UDP sockets are bound to the local address that routes to the BMC (the controller
finds it and sends it as ``local``), never to every interface: pyghmi binds ``('', 0)``
in ``Session._assignsocket`` and offers no option, so that one method is replaced here,
in this process only (``_bound_socket``).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import operator
import os
import socket
import sys
import threading
from typing import Any, TextIO

from pyghmi import exceptions as ipmi_errors
from pyghmi.ipmi import command as ipmi_command
from pyghmi.ipmi.private import session as ipmi_session

from metalmend.bmc import ipmi_wakeup

# Our operations -> IPMI Chassis Control (NetFn chassis 0x00, command 0x02) codes: power
# down (hard), power up, soft shutdown (ACPI), as IPMI 2.0 section 28.3 defines them.
CHASSIS_CONTROL = {"off": 0, "on": 1, "shutdown": 5}

_AUTH_MARKERS = ("unauthorized", "password", "insufficient privilege", "username")
_TIMEOUT_MARKERS = ("timeout", "timed out", "no response")

_local = threading.local()  # the local address the current thread's session binds to
_commands: dict[tuple[str, int, str, str], Any] = {}
_commands_lock = threading.Lock()
_sockets_lock = threading.Lock()


def _bound_socket(cls: Any, server: Any = None, forbiddensockets: Any = ()) -> socket.socket:
    """pyghmi's ``Session._assignsocket`` for a client, bound to ``_local.address``: reuse
    a socket on that address with room (pyghmi shares one socket among up to
    ``MAX_BMCS_PER_SOCKET`` BMCs), else make one."""
    address: str = _local.address
    with _sockets_lock:
        ranked = sorted(cls.socketpool.items(), key=operator.itemgetter(1))
        for sock, users in ranked:
            if (
                users < ipmi_session.MAX_BMCS_PER_SOCKET
                and sock not in forbiddensockets
                and sock.getsockname()[0] == address
            ):
                cls.socketpool[sock] += 1
                return sock  # type: ignore[no-any-return]
        family = socket.AF_INET6 if ":" in address else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_DGRAM)
        with contextlib.suppress(OSError):  # the kernel's limit then; only a buffer size
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
        sock.bind((address, 0))
        cls.socketpool[sock] = 1
        ipmi_session.iosockets.append(sock)
        if ipmi_session.myself is None:
            # pyghmi wakes its IO thread with a packet from its first socket to itself,
            # sent to ``myself``; that socket listens on ``address`` only.
            ipmi_session.myself = address
    if ipmi_session.iothread is None:
        ready = threading.Event()
        ipmi_session.iothreadwaiters.append(ready)
        ipmi_session.iothread = ipmi_session.define_worker()()
        ipmi_session.iothread.daemon = True
        ipmi_session.iothread.start()
        ready.wait()
    elif not ipmi_session.iothreadready:
        ready = threading.Event()
        ipmi_session.iothreadwaiters.append(ready)
        ready.wait()
    return sock


def _patch_pyghmi() -> None:
    ipmi_session.Session._assignsocket = classmethod(_bound_socket)
    # IPv4 BMCs are addressed as IPv4, on IPv4 sockets (pyghmi would map them into a
    # dual-stack IPv6 socket bound to every interface).
    ipmi_session.ipv6support = False
    # Answers that arrive before their reader waits are read at once, not after the
    # retransmission timer (bmc/ipmi_wakeup.py).
    ipmi_wakeup.install()


def _key(request: dict[str, Any]) -> tuple[str, int, str, str]:
    """(BMC, port, user, digest of the password): the password is not kept as a key."""
    digest = hashlib.sha256(str(request["password"]).encode()).hexdigest()
    return (request["host"], int(request["port"]), request["username"], digest)


def _command(request: dict[str, Any]) -> Any:
    """A logged-in Command for (BMC, user), reused while its session lives: pyghmi would
    block a second Command on a session that is still logging in."""
    password: str = request["password"]
    key = _key(request)
    with _commands_lock:
        command = _commands.get(key)
    session = getattr(command, "ipmi_session", None)
    if command is not None and session is not None and not session.broken and session.logged:
        return command
    _local.address = request["local"]
    command = ipmi_command.Command(
        bmc=request["host"], userid=request["username"], password=password, port=key[1]
    )
    with _commands_lock:
        _commands[key] = command
    return command


def _chassis_control(command: Any, code: int) -> None:
    """One Chassis Control round trip, as ipmitool's ``chassis power`` sends it. Not
    pyghmi's ``set_power``: it reads the power first (a second round trip) and sends
    nothing when it reads the state asked for; the controller has just read the power
    and decided, and a reboot's latency is round trips."""
    response = command.raw_command(netfn=0, command=2, data=[code])
    if "error" in response:
        raise ipmi_errors.IpmiException(response["error"], response.get("code", 0))


def _forget(request: dict[str, Any]) -> None:
    """Drop what this (BMC, user, password) left in this process after a failure, and
    only that: another password of the same user (the BMC's real one, used by the host
    that owns it) keeps its logged-in session."""
    with _commands_lock:
        _commands.pop(_key(request), None)
    # pyghmi keeps a session that is logging in under (bmc, user, password, port, kg) as
    # given, and drops it after the login under the same names as bytes: never found, so
    # the session stays there, failed or logged in. A later Command for these names is
    # handed that session and waits for a login that never comes, to the deadline (a
    # host with a wrong password made the next call of the BMC's own host time out).
    initting = ipmi_session.Session.initting_sessions
    initting.pop((request["host"], request["username"], request["password"],
                  int(request["port"]), None), None)  # fmt: skip


def handle(request: dict[str, Any]) -> dict[str, Any]:
    answer: dict[str, Any] = {"id": request["id"]}
    try:
        command = _command(request)
        if request["op"] == "state":
            power = command.get_power()
            answer["power"] = "off" if power.get("powerstate") == "off" else "on"
        else:
            _chassis_control(command, CHASSIS_CONTROL[request["op"]])
            answer["ok"] = True
    except ipmi_errors.IpmiException as error:
        _forget(request)
        answer.update(_classify(str(error), getattr(error, "ipmicode", 0)))
    except Exception as error:  # pyghmi raises more than IpmiException
        _forget(request)
        answer.update(error="failed", message=f"{type(error).__name__}: {error}")
    return answer


def _classify(text: str, code: int) -> dict[str, str]:
    """pyghmi's error texts are fixed phrases and BMC completion codes, never the
    password (it is only ever hashed into RAKP messages)."""
    lowered = text.lower()
    if any(marker in lowered for marker in _AUTH_MARKERS):
        return {"error": "auth", "message": text}
    if any(marker in lowered for marker in _TIMEOUT_MARKERS):
        return {"error": "timeout", "message": text}
    if code in (0xC1, 0xCC):  # invalid command, invalid data field
        return {"error": "unsupported", "message": text}
    return {"error": "failed", "message": text}


def serve(requests: TextIO, answers: TextIO) -> None:
    write_lock = threading.Lock()

    def run(request: dict[str, Any]) -> None:
        line = json.dumps(handle(request))
        with write_lock:
            answers.write(line + "\n")
            answers.flush()

    for line in requests:
        request = json.loads(line)
        threading.Thread(target=run, args=(request,), daemon=True).start()
    # stdin closed: the controller is gone (or let us go); so are we.


def main() -> None:
    _patch_pyghmi()
    # Answers go to the pipe the controller reads; anything printed by a library goes to
    # stderr instead of corrupting the protocol.
    answers = os.fdopen(os.dup(sys.stdout.fileno()), "w", encoding="utf-8")
    sys.stdout = sys.stderr
    answers.write(json.dumps({"ready": True}) + "\n")
    answers.flush()
    serve(sys.stdin, answers)
    os._exit(0)  # pyghmi's IO thread is not a daemon we could join; leave at once


if __name__ == "__main__":
    main()
