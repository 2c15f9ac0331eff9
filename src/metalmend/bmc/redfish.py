"""Redfish power control: reading this is reading Redfish.

The service root (``/redfish/v1/``) links the Systems collection; its members are the
ComputerSystems the BMC serves. One driver drives exactly one of them: the system the
address names, or the BMC's only system when the address names none. A system path that
the BMC does not serve, and a BMC with several systems when none is named, are errors
naming the systems it has, never a fallback to another system (for fencing, powering off
the wrong server is split brain). The ComputerSystem's ``PowerState`` is the power state;
its ``#ComputerSystem.Reset`` action (``target``, with the reset types it allows in
``ResetType@Redfish.AllowableValues`` or its ``@Redfish.ActionInfo``) changes it. The same
driver lists the system's drives and erases one (``#Drive.SecureErase``): what those
answers mean is in ``bmc/storage.py``; here, every drive, storage subsystem and action
target must lie under the system's own path.

The client is libcurl's multi interface driven by the asyncio loop (``bmc/curl.py``), not
sushy: sushy is blocking, so a call to a BMC that answers slowly forever could only be
abandoned in a thread that lives on, holding its connection and the BMC's slot. Here a
call is a coroutine: cancelling it (the pool's deadline, or this driver's own) ends the
transfer and closes the connection at once.

What a BMC says is never trusted for size or shape: every answer is read as it arrives,
the transfer stopped past ``max_response_bytes``; an answer that is not the JSON expected
is an error saying so; any text of the BMC put into a message is cut to
``max_message_chars`` (its start kept). Links the BMC gives are followed only if they
are plain paths under ``/redfish/v1/`` of the same endpoint, and redirects are not
followed: the credentials go nowhere but the address the host names. HTTP basic
authentication is sent with each request over TLS: no Redfish session is created, so a
cancelled call or a dropped driver never leaves a session behind on a BMC (BMCs allow only
a handful at a time). The password is only ever inside the ``Authorization`` header,
never in any text.
"""

from __future__ import annotations

import asyncio
import errno
import json
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Final, TypeVar
from urllib.parse import unquote, urlsplit

import pycurl

from metalmend.api.storage import Drive
from metalmend.bmc.address import (
    REDFISH_ROOT,
    BmcAddress,
    check_allowed,
    redfish_path_problem,
    refuse_cleartext,
)
from metalmend.bmc.curl import NO_CHECK, Connection, Failed, Trust, trust_for
from metalmend.bmc.driver import PowerAction, PowerState
from metalmend.bmc.errors import (
    AuthenticationFailed,
    BadAddress,
    BmcError,
    TimedOut,
    Unreachable,
    Unsupported,
    cap,
)
from metalmend.bmc.settings import BmcSettings
from metalmend.bmc.storage import (
    FAILED_TASK_STATES,
    MAX_DRIVES,
    MAX_STORAGE,
    RUNNING_TASK_STATES,
    SECURE_ERASE_ACTION,
    EraseFailed,
    EraseStatus,
    drive_from_redfish,
    erase_in_drive,
    task_state,
)

T = TypeVar("T")

RESET_TYPES: Final[dict[PowerAction, str]] = {
    PowerAction.ON: "On",
    PowerAction.SOFT_OFF: "GracefulShutdown",
    PowerAction.HARD_OFF: "ForceOff",
}
"""Our power vocabulary -> the ResetType of Redfish's ComputerSystem.Reset action."""

RESET_ACTION = "#ComputerSystem.Reset"
COMPUTER_SYSTEM_TYPE = "#ComputerSystem."
"""Start of a ComputerSystem's ``@odata.type`` (``#ComputerSystem.v1_20_0.ComputerSystem``)."""

MAX_COLLECTION_PAGES = 16
"""Pages of a Systems collection followed (``Members@odata.nextLink``); BMCs serve one."""

IDLE_CONNECTION = 5.0
"""Seconds a BMC connection stays open after a call: long enough for the calls of one
reconcile and for a power change being watched land (polls 0.1-1 s apart), shorter than
the idle power poll (20 s), which connects again (after a routine poll the pool hangs up
at once: BmcPool._call). A keep-alive connection is only found expired when it is used
next, so without closing it here every driver kept a dead TLS connection (about 35 KiB)
from one poll to the next: 170 MiB at 5,000 hosts (benchmarks/scale.py)."""

SYSTEMS_SHOWN = 5
"""Systems named in an error message; more are counted."""

# A Redfish error whose MessageId says the ResetType is not one the system takes.
_UNSUPPORTED_MESSAGE_IDS = ("ActionParameterValueNotInList", "ActionParameterNotSupported")
_NEXT_LINK_QUERY = re.compile(r"[A-Za-z0-9$=&_.\-]{1,64}")
_UNPRINTABLE = {c: " " for c in (*range(0x20), *range(0x7F, 0xA0), 0x2028, 0x2029)}
_REQUEST_HEADERS = (
    "Accept: application/json",
    "Accept-Encoding: identity",  # a compressed answer could hide its size
    "OData-Version: 4.0",
    "Expect:",  # no 100-continue round trip
)
_JSON_BODY = "Content-Type: application/json"


@dataclass(frozen=True)
class Answer:
    """A BMC's HTTP answer as read (never more than ``max_response_bytes`` of it)."""

    status: int
    body: bytes
    complete: bool
    """False: the answer was larger than the cap and ``body`` is only its start."""
    location: str | None = None
    """The ``Location`` header (a task monitor, after an action answered 202)."""


class RedfishDriver:
    """Power of the one ComputerSystem the address names, through its BMC's Redfish
    service. ``verify`` is False (no certificate check: the host's
    ``disableCertificateVerification``), True (the system's CAs) or the path of a CA bundle,
    trusted besides the system's CAs when ``system_cas`` (the pool passes what
    ``address.check_trust`` allows). ``connect_to`` is the IP address vetted by
    ``address.check_allowed``: when given, the driver connects there (TLS still checks the
    certificate against the host name of the address)."""

    def __init__(
        self,
        address: BmcAddress,
        username: str,
        password: str,
        verify: bool | str,
        settings: BmcSettings,
        connect_to: str | None = None,
        *,
        system_cas: bool = True,
    ) -> None:
        self.address = address
        self._username = username
        self._password = password
        self._verify = verify
        self._system_cas = system_cas or verify is True
        self._settings = settings
        self._connect_to = connect_to
        self._client: Connection | None = None  # connected (until hung up or dropped)
        self._spare: Connection | None = None  # hung up: its handle serves the next call
        self._base = ""
        self._ours: set[str] = set()  # the netlocs that name this endpoint
        self._system_path: str | None = None  # found once, forgotten on any error
        # The system's Reset action (target, allowed types), read once like the path: a
        # power command is then one POST, not a GET of the system first (the controller
        # has just read the system for its power state). Forgotten on any error.
        self._reset_action: tuple[str, set[str] | None] | None = None
        self._calls = 0  # calls in progress
        self._idle_since = 0.0  # loop time the last call ended
        self._idle_timer: asyncio.TimerHandle | None = None

    # ---- the driver interface -----------------------------------------------------

    async def power_state(self) -> PowerState:
        return await self._guarded(self._read_power_state)

    async def act(self, action: PowerAction) -> None:
        async def reset() -> None:
            await self._reset(RESET_TYPES[action])

        await self._guarded(reset)

    async def close(self) -> None:
        await self._drop()

    def hang_up(self) -> None:
        """Close the connection at once, not after IDLE_CONNECTION (BmcPool._call says why)."""
        if self._calls == 0:
            self._close_connection()

    # ---- drives (the StorageDriver interface of bmc/storage.py) ---------------------

    async def drives(self) -> list[Drive]:
        return await self._guarded(self._read_drives)

    async def start_erase(self, drive_id: str) -> str | None:
        async def erase() -> str | None:
            return await self._start_erase(drive_id)

        return await self._guarded(erase)

    async def erase_status(self, drive_id: str, monitor: str | None) -> EraseStatus:
        async def status() -> EraseStatus:
            return await self._erase_status(drive_id, monitor)

        return await self._guarded(status)

    # ---- Redfish: drives -----------------------------------------------------------

    async def _read_drives(self) -> list[Drive]:
        path, system = await self._system()
        collection = self._under_system(
            _odata_id(system.get("Storage")), path, f"the Storage link of {path}"
        )
        storages, unusable = await self._members(collection)
        if unusable:
            raise BmcError(f"{self.address}: {collection} lists {unusable} unusable members")
        if len(storages) > MAX_STORAGE:
            raise BmcError(
                f"{self.address}: {collection} lists {len(storages)} storage subsystems,"
                f" more than the {MAX_STORAGE} read"
            )
        drive_paths: list[str] = []
        for storage_path in storages:
            self._under_system(storage_path, path, f"the storage {storage_path}")
            storage = self._document(await self._send("GET", storage_path), "GET", storage_path)
            links = storage.get("Drives", [])
            if not isinstance(links, list):
                raise BmcError(f"{self.address}: Drives of {storage_path} is not a list")
            if len(drive_paths) + len(links) > MAX_DRIVES:
                raise BmcError(
                    f"{self.address}: the system {path} lists more than {MAX_DRIVES} drives;"
                    " not read"
                )
            for link in links:
                drive_path = self._under_system(
                    _odata_id(link), path, f"a drive link of {storage_path}"
                )
                if drive_path not in drive_paths:  # a drive may sit in two subsystems
                    drive_paths.append(drive_path)
        drives = []
        for drive_path in drive_paths:
            resource = self._document(await self._send("GET", drive_path), "GET", drive_path)
            drives.append(drive_from_redfish(drive_path, resource))
        return drives

    async def _drive(self, drive_id: str) -> tuple[str, dict[str, Any]]:
        """The system's path and the Drive resource ``drive_id`` (under that system only)."""
        path, _ = await self._system()
        self._under_system(drive_id, path, f"the drive {drive_id}")
        answer = await self._send("GET", drive_id)
        if answer.status == 404:
            raise BmcError(f"{self.address}: the system {path} has no drive {drive_id}")
        return path, self._document(answer, "GET", drive_id)

    async def _start_erase(self, drive_id: str) -> str | None:
        path, drive = await self._drive(drive_id)
        if not erase_in_drive(drive).finished:
            # Already busy (our own erase, asked again after a restart): never a second one.
            return self._running_task(drive)
        actions = drive.get("Actions")
        erase = actions.get(SECURE_ERASE_ACTION) if isinstance(actions, dict) else None
        if not isinstance(erase, dict):
            raise Unsupported(
                f"{self.address}: the drive {drive_id} offers no {SECURE_ERASE_ACTION} action"
            )
        target = self._under_system(
            erase.get("target"), path, f"the target of {SECURE_ERASE_ACTION} of {drive_id}"
        )
        answer = await self._send("POST", target, {})
        if answer.status == 202:
            return self._task_monitor(answer.location, target)
        if 200 <= answer.status < 300:
            return None  # done while we waited: the Drive shows no operation left
        raise self._status_error(answer, "POST", target)

    async def _erase_status(self, drive_id: str, monitor: str | None) -> EraseStatus:
        if monitor is not None:
            checked = self._checked_link(monitor, "the erase's task monitor")
            answer = await self._send("GET", checked)
            if answer.status != 404:  # 404: the BMC forgot the task; the Drive says
                return self._erase_in_task(drive_id, checked, answer)
        _, drive = await self._drive(drive_id)
        return erase_in_drive(drive)

    def _erase_in_task(self, drive_id: str, monitor: str, answer: Answer) -> EraseStatus:
        if answer.complete and not answer.body.strip() and 200 <= answer.status < 300:
            # 202: still running; any other success without a body (204 No Content): the
            # monitor answers with the action's own (empty) result, so it is over.
            return EraseStatus(finished=False) if answer.status == 202 else EraseStatus(True, 100)
        task = self._document(answer, "GET", monitor)
        state, percent, said = task_state(task)
        if state in FAILED_TASK_STATES:
            raise EraseFailed(
                self._with_bmc_text(
                    f"{self.address}: the erase of {drive_id} ended {state}"
                    + (": " if said else ""),
                    said,
                )
            )
        if answer.status == 202 or state in RUNNING_TASK_STATES:
            return EraseStatus(finished=False, percent=percent)
        return EraseStatus(finished=True, percent=100)

    def _running_task(self, drive: dict[str, Any]) -> str | None:
        """The task of the operation a busy drive lists, if it names one we may follow."""
        operations = drive.get("Operations")
        for operation in operations if isinstance(operations, list) else []:
            task = (
                _odata_id(operation.get("AssociatedTask")) if isinstance(operation, dict) else None
            )
            if isinstance(task, str) and redfish_path_problem(task) is None:
                return task
        return None

    def _task_monitor(self, location: str | None, target: str) -> str | None:
        """The task monitor of a 202 answer: a path on this BMC (an absolute URL only if it
        names the endpoint we talk to), or None when the BMC gave none."""
        if location is None:
            return None
        parts = urlsplit(location)
        if parts.scheme or parts.netloc:
            if parts.netloc not in self._ours or parts.scheme != self.address.scheme:
                raise BmcError(
                    self._with_bmc_text(
                        f"{self.address}: POST {target} names a task monitor on another"
                        " endpoint; not followed: ",
                        location,
                    )
                )
            location = parts.path
        return self._checked_link(location, f"the task monitor of POST {target}")

    def _under_system(self, link: object, system_path: str, what: str) -> str:
        """``link`` if it is a plain path under the system's own path, else an error: a
        drive or an action elsewhere belongs to something this host does not own."""
        checked = self._checked_link(link, what)
        if not unquote(checked).startswith(unquote(system_path).rstrip("/") + "/"):
            raise BmcError(
                self._with_bmc_text(
                    f"{self.address}: {what} is outside the system {system_path}; not followed: ",
                    checked,
                )
            )
        return checked

    # ---- Redfish ------------------------------------------------------------------

    async def _read_power_state(self) -> PowerState:
        path, system = await self._system()
        if "PowerState" not in system:
            raise BmcError(f"{self.address}: the system {path} does not report its PowerState")
        state = system["PowerState"]
        if state == "Off":
            return PowerState.OFF
        if state is None or isinstance(state, str):
            # On, PoweringOn, PoweringOff, Paused, or unknown (null): not definitely off.
            return PowerState.ON
        raise BmcError(
            self._with_bmc_text(
                f"{self.address}: PowerState of {path} is not a Redfish power state: ",
                json.dumps(state)[:1000],
            )
        )

    async def _reset(self, reset_type: str) -> None:
        if self._reset_action is None:
            self._reset_action = await self._find_reset_action()
        target, allowed = self._reset_action
        if allowed is not None and reset_type not in allowed:
            offered = ", ".join(sorted(allowed)) or "none"
            raise Unsupported(
                self._with_bmc_text(
                    f"{self.address} does not offer ResetType {reset_type}; it offers: ",
                    offered,
                )
            )
        answer = await self._send("POST", target, {"ResetType": reset_type})
        if 200 <= answer.status < 300:
            return
        if answer.status == 400 and any(
            marker in answer.body.decode("utf-8", "replace") for marker in _UNSUPPORTED_MESSAGE_IDS
        ):
            raise Unsupported(
                self._with_bmc_text(
                    f"{self.address} refused ResetType {reset_type}: ",
                    redfish_message(answer),
                )
            )
        raise self._status_error(answer, "POST", target)

    async def _find_reset_action(self) -> tuple[str, set[str] | None]:
        _, system = await self._system()
        actions = system.get("Actions")
        reset = actions.get(RESET_ACTION) if isinstance(actions, dict) else None
        if not isinstance(reset, dict):
            raise Unsupported(f"{self.address}: the system offers no {RESET_ACTION} action")
        target = self._checked_link(reset.get("target"), f"the target of {RESET_ACTION}")
        return target, await self._allowed_reset_types(reset)

    async def _allowed_reset_types(self, reset: dict[str, Any]) -> set[str] | None:
        """The reset types the system takes, or None when it does not say."""
        values = reset.get("ResetType@Redfish.AllowableValues")
        if isinstance(values, list):
            return {v for v in values if isinstance(v, str)}
        info_link = reset.get("@Redfish.ActionInfo")
        if not isinstance(info_link, str):
            return None
        info_path = self._checked_link(info_link, "the @Redfish.ActionInfo of the reset action")
        answer = await self._send("GET", info_path)
        if answer.status == 404:
            return None
        info = self._document(answer, "GET", info_path)
        parameters = info.get("Parameters")
        for parameter in parameters if isinstance(parameters, list) else []:
            if isinstance(parameter, dict) and parameter.get("Name") == "ResetType":
                values = parameter.get("AllowableValues")
                if isinstance(values, list):
                    return {v for v in values if isinstance(v, str)}
        return None

    async def _system(self) -> tuple[str, dict[str, Any]]:
        """The system's path and its ComputerSystem resource, as read now."""
        if self._system_path is None:
            return await self._discover()
        path = self._system_path
        answer = await self._send("GET", path)
        if answer.status == 404:
            # Gone since we found it: find it again, so the error names what the BMC has.
            self._system_path = None
            return await self._discover()
        system = self._document(answer, "GET", path)
        self._check_computer_system(path, system)
        return path, system

    async def _discover(self) -> tuple[str, dict[str, Any]]:
        """Service root -> Systems collection -> the one system this driver is for."""
        wanted = self.address.system_path
        if wanted:
            problem = redfish_path_problem(wanted)
            if problem is not None:
                raise BadAddress(f"{self.address}: the system path is not usable: {problem}")
        answer = await self._send("GET", REDFISH_ROOT)
        if answer.status == 404:
            raise BadAddress(f"{self.address.endpoint} serves no Redfish service ({REDFISH_ROOT})")
        root = self._document(answer, "GET", REDFISH_ROOT)
        systems = self._checked_link(
            _odata_id(root.get("Systems")), f"the Systems link of {REDFISH_ROOT}"
        )
        members, unusable = await self._members(systems)
        listing = _listing(members, unusable)
        if wanted:
            path = next((m for m in members if _same_path(m, wanted)), None)
            if path is None:
                raise BadAddress(
                    self._with_bmc_text(
                        f"the BMC at {self.address.endpoint} serves no system {wanted}: ",
                        listing,
                    )
                )
        elif len(members) == 1 and not unusable:
            path = members[0]
        else:
            raise BadAddress(
                self._with_bmc_text(
                    f"the BMC at {self.address.endpoint} serves {len(members) + unusable}"
                    " systems and the address names none; name one in spec.bmc.address: ",
                    listing,
                )
            )
        answer = await self._send("GET", path)
        if answer.status == 404:
            raise BadAddress(
                self._with_bmc_text(
                    f"the BMC at {self.address.endpoint} lists {path} but does not serve it"
                    " (404): ",
                    listing,
                )
            )
        system = self._document(answer, "GET", path)
        self._check_computer_system(path, system)
        self._system_path = path
        return path, system

    async def _members(self, collection: str) -> tuple[list[str], int]:
        """The member paths of a collection (all pages), and how many members were not
        usable paths: those are never driven, but still count as systems the BMC has (a
        BMC with one usable and one broken entry does not have exactly one system)."""
        members: list[str] = []
        unusable = 0
        page: str | None = collection
        for _ in range(MAX_COLLECTION_PAGES):
            if page is None:
                return members, unusable
            document = self._document(await self._send("GET", page), "GET", page)
            listed = document.get("Members")
            if not isinstance(listed, list):
                raise BmcError(f"{self.address}: the collection {collection} has no Members list")
            for member in listed:
                link = _odata_id(member)
                if isinstance(link, str) and redfish_path_problem(link) is None:
                    members.append(link)
                else:
                    unusable += 1
            page = self._next_page(document.get("Members@odata.nextLink"), collection)
        if page is not None:
            raise BmcError(
                f"{self.address}: the collection {collection} has more than"
                f" {MAX_COLLECTION_PAGES} pages"
            )
        return members, unusable

    def _next_page(self, link: object, collection: str) -> str | None:
        if link is None:
            return None
        path, _, query = link.partition("?") if isinstance(link, str) else ("", "", "")
        checked = self._checked_link(path, f"the next page of {collection}")
        if query and not _NEXT_LINK_QUERY.fullmatch(query):
            raise BmcError(
                self._with_bmc_text(
                    f"{self.address}: the next page link of {collection} is not usable: ",
                    str(link),
                )
            )
        return f"{checked}?{query}" if query else checked

    def _check_computer_system(self, path: str, system: dict[str, Any]) -> None:
        kind = system.get("@odata.type")
        if not (isinstance(kind, str) and kind.startswith(COMPUTER_SYSTEM_TYPE)):
            raise BadAddress(
                self._with_bmc_text(
                    f"{path} at the BMC {self.address.endpoint} is not a ComputerSystem;"
                    " its @odata.type is ",
                    json.dumps(kind)[:1000],
                )
            )

    def _checked_link(self, link: object, what: str) -> str:
        """``link`` if it is a plain path under /redfish/v1/ (never another host)."""
        if not isinstance(link, str):
            raise BmcError(f"{self.address}: {what} is missing or not a string")
        problem = redfish_path_problem(link)
        if problem is not None:
            raise BmcError(
                self._with_bmc_text(f"{self.address}: {what} is not followed ({problem}): ", link)
            )
        return link

    # ---- HTTP ---------------------------------------------------------------------

    async def _guarded(self, work: Callable[[], Awaitable[T]]) -> T:
        """Run ``work`` under this driver's own deadline, typing every failure; after any
        failure or cancellation the connection is closed and the system found again.
        After a success the connection stays open for IDLE_CONNECTION seconds."""
        self._calls += 1
        try:
            return await self._deadline(work)
        finally:
            self._calls -= 1
            self._idle_since = asyncio.get_running_loop().time()
            if self._client is not None and self._idle_timer is None:
                self._idle_timer = asyncio.get_running_loop().call_later(
                    IDLE_CONNECTION, self._close_if_idle
                )

    def _close_if_idle(self) -> None:
        """(A timer.) Close the connection of a driver unused for IDLE_CONNECTION; what it
        found (the system, its reset action) is kept: the next call only connects again."""
        self._idle_timer = None
        if self._client is None:
            return
        idle = asyncio.get_running_loop().time() - self._idle_since
        if self._calls or idle < IDLE_CONNECTION:  # used since: look again when it may be
            wait = max(IDLE_CONNECTION - idle, 0.0) if not self._calls else IDLE_CONNECTION
            self._idle_timer = asyncio.get_running_loop().call_later(wait, self._close_if_idle)
            return
        self._close_connection()

    def _close_connection(self) -> None:
        """Close the connection now; the system found stays known, and so does the
        transport's handle (its options set once), for the next call to connect again."""
        if self._idle_timer is not None:
            self._idle_timer.cancel()
            self._idle_timer = None
        client, self._client = self._client, None
        if client is None:
            return
        if client.busy:  # not between requests: never reused
            _close_quietly(client)
            return
        try:
            client.hang_up()
        except Exception:  # a connection already broken cannot be closed any better
            _close_quietly(client)
            return
        self._spare = client

    async def _deadline(self, work: Callable[[], Awaitable[T]]) -> T:
        try:
            async with asyncio.timeout(self._settings.timeout):
                return await work()
        except BmcError:
            await self._drop()
            raise
        except TimeoutError:  # our own deadline
            await self._drop()
            raise self._timed_out() from None
        except Failed as error:
            await self._drop()
            raise self._transport_error(error) from None
        except asyncio.CancelledError:
            # The caller's deadline: stop here, the connection really closed.
            await self._drop()
            raise
        except Exception as error:  # a bug or a library surprise: still one clear line
            await self._drop()
            raise BmcError(
                self._with_bmc_text(f"{self.address}: {type(error).__name__}: ", str(error))
            ) from None

    async def _connection(self) -> Connection:
        if self._client is not None:
            return self._client
        if self._spare is not None:  # hung up after the last call: connects again
            self._client, self._spare = self._spare, None
            return self._client
        refuse_cleartext(self.address, self._settings)
        if self._connect_to is None and self._settings.allowed_networks:
            # The pool vets the address and passes the vetted IP; never connect by name
            # to a restricted network without it.
            self._connect_to = await check_allowed(self.address, self._settings)
        address = self.address
        named = f"[{address.host}]" if ":" in address.host else address.host
        port = address.effective_port
        # The URL names the BMC (the Host header, SNI and the certificate check use it);
        # CONNECT_TO makes the vetted IP what is dialled, and nothing else: no DNS answer
        # given after the check can change it.
        self._base = f"{address.scheme}://{named}:{port}"
        self._ours = {f"{named}:{port}", f"{named}:{address.port}" if address.port else named}
        connect_to = None
        if self._connect_to is not None and self._connect_to != address.host:
            vetted = f"[{self._connect_to}]" if ":" in self._connect_to else self._connect_to
            connect_to = f"{named}:{port}:{vetted}:{port}"
            self._ours.add(f"{vetted}:{port}")
        self._client = Connection(
            self._trust() if address.scheme == "https" else NO_CHECK,
            scheme=address.scheme,
            username=self._username,
            password=self._password,
            timeout=self._settings.timeout,
            connect_to=connect_to,
        )
        return self._client

    def _trust(self) -> Trust:
        if self._verify is False:
            return NO_CHECK
        bundle = self._verify if isinstance(self._verify, str) else None
        return trust_for(bundle, system_cas=self._system_cas)

    async def _send(self, method: str, path: str, payload: Any = None) -> Answer:
        """One request; the answer read as it arrives, at most ``max_response_bytes``."""
        connection = await self._connection()
        headers = list(_REQUEST_HEADERS)
        body = None
        if payload is not None:
            body = json.dumps(payload).encode()
            headers.append(_JSON_BODY)
        answer = await connection.request(
            method, self._base + path, headers, body, self._settings.max_response_bytes
        )
        if answer.encoding_refused is not None:
            raise BmcError(
                self._with_bmc_text(
                    f"{self.address}: {method} {path} answered in an encoding not asked for: ",
                    answer.encoding_refused,
                )
            )
        # Unread, the rest of a large answer is not drained: libcurl closed the connection.
        location = answer.headers.get("location")
        return Answer(answer.status, bytes(answer.body), answer.complete, location)

    def _document(self, answer: Answer, method: str, path: str) -> dict[str, Any]:
        """The JSON object of a successful answer, or the error it is."""
        if not 200 <= answer.status < 300:
            raise self._status_error(answer, method, path)
        if not answer.complete:
            raise self._too_large(method, path)
        try:
            document = json.loads(answer.body)
        except (ValueError, RecursionError):  # RecursionError: a hostile deep nesting
            raise BmcError(
                self._with_bmc_text(
                    f"{self.address}: {method} {path} answered something that is not JSON: ",
                    answer.body[:2000].decode("utf-8", "replace"),
                )
            ) from None
        if not isinstance(document, dict):
            raise BmcError(
                f"{self.address}: {method} {path} answered JSON that is not an object"
                f" ({type(document).__name__})"
            )
        return document

    def _status_error(self, answer: Answer, method: str, path: str) -> BmcError:
        status = answer.status
        said = redfish_message(answer)
        if status in (401, 403):
            return AuthenticationFailed(
                self._with_bmc_text(
                    f"{self.address} refused the credentials (HTTP {status} on {method} {path})"
                    + (": " if said else ""),
                    said,
                )
            )
        if 300 <= status < 400:
            return BmcError(
                f"{self.address}: {method} {path} answered HTTP {status}, a redirect; not"
                " followed (credentials go only to the address the host names)"
            )
        if not answer.complete:
            return BmcError(
                self._with_bmc_text(
                    f"{self.address}: HTTP {status} on {method} {path}, with an answer larger"
                    f" than {self._settings.max_response_bytes} bytes starting: ",
                    said,
                )
            )
        return BmcError(
            self._with_bmc_text(
                f"{self.address}: HTTP {status} on {method} {path}" + (": " if said else ""),
                said,
            )
        )

    def _too_large(self, method: str, path: str) -> BmcError:
        return BmcError(
            f"{self.address}: {method} {path}: answer larger than"
            f" {self._settings.max_response_bytes} bytes; not read"
        )

    def _timed_out(self) -> TimedOut:
        return TimedOut(f"{self.address} did not answer in {self._settings.timeout:g}s")

    def _transport_error(self, error: Failed) -> BmcError:
        """libcurl's failure as the same domain error, and words, as users saw before."""
        code, text = error.code, error.message
        if code == pycurl.E_OPERATION_TIMEDOUT:
            return self._timed_out()
        if code == pycurl.E_PEER_FAILED_VERIFICATION:
            return BmcError(
                self._with_bmc_text(
                    f"{self.address}: the BMC's TLS certificate is not trusted (give the BMC a"
                    " certificate of the BMC CA bundle): ",
                    _tls_reason(text),
                )
            )
        if code in (pycurl.E_SSL_CACERT_BADFILE, pycurl.E_SSL_CERTPROBLEM):
            return BmcError(
                self._with_bmc_text(f"{self.address}: cannot load the BMC CA bundle: ", text)
            )
        if code in (pycurl.E_SSL_CONNECT_ERROR, pycurl.E_RECV_ERROR, pycurl.E_SEND_ERROR) and (
            _closed_during_tls(error)
        ):
            # The other end closed the connection (a cut line, a BMC restarting): a network
            # fault, not a TLS disagreement for the operator to fix.
            reason = "the connection was closed during TLS"
            if code == pycurl.E_SSL_CONNECT_ERROR:
                return Unreachable(f"cannot reach {self.address}: {reason}")
            return Unreachable(f"{self.address} dropped the connection: {reason}")
        if code == pycurl.E_SSL_CONNECT_ERROR:
            return BmcError(self._with_bmc_text(f"{self.address}: TLS failed: ", _tls_reason(text)))
        if code in (pycurl.E_COULDNT_CONNECT, pycurl.E_COULDNT_RESOLVE_HOST):
            return Unreachable(f"cannot reach {self.address}: {_network_reason(error)}")
        if code in _PROTOCOL_ERRORS or "too large" in text.lower():  # endless headers
            return BmcError(self._with_bmc_text(f"{self.address} broke the HTTP protocol: ", text))
        if code in (pycurl.E_RECV_ERROR, pycurl.E_SEND_ERROR):
            return Unreachable(f"{self.address} dropped the connection: {_network_reason(error)}")
        if code == pycurl.E_GOT_NOTHING:
            return BmcError(
                f"{self.address} broke the HTTP protocol: Server disconnected without sending"
                " a response."
            )
        return BmcError(self._with_bmc_text(f"{self.address}: curl error {code}: ", text))

    def _with_bmc_text(self, prefix: str, text: str) -> str:
        """``prefix`` (ours) and the start of ``text`` (the BMC's), at most
        ``max_message_chars`` in all when the prefix leaves room."""
        limit = self._settings.max_message_chars
        room = max(limit - len(prefix), min(limit, 40))  # a long address still gets a word in
        return prefix + cap(text.translate(_UNPRINTABLE), room)

    async def _drop(self) -> None:
        """Close the connection, free the transport and forget the system; never raises."""
        self._system_path = None
        self._reset_action = None
        if self._idle_timer is not None:
            self._idle_timer.cancel()
            self._idle_timer = None
        for connection in (self._client, self._spare):
            if connection is not None:
                _close_quietly(connection)
        self._client = self._spare = None


def redfish_message(answer: Answer) -> str:
    """What a Redfish error answer says: its @Message.ExtendedInfo messages, else its
    error.message, else the start of its body as text (uncapped: the caller caps)."""
    if answer.complete:
        try:
            document = json.loads(answer.body)
        except (ValueError, RecursionError):
            document = None
        error = document.get("error") if isinstance(document, dict) else None
        if isinstance(error, dict):
            infos = error.get("@Message.ExtendedInfo")
            texts = [
                info["Message"]
                for info in (infos if isinstance(infos, list) else [])
                if isinstance(info, dict) and isinstance(info.get("Message"), str)
            ]
            if not texts and isinstance(error.get("message"), str):
                texts = [error["message"]]
            if texts:
                return "; ".join(texts)
    return answer.body[:4000].decode("utf-8", "replace").strip()


def _odata_id(reference: object) -> object:
    return reference.get("@odata.id") if isinstance(reference, dict) else None


def _same_path(a: str, b: str) -> bool:
    return unquote(a).rstrip("/") == unquote(b).rstrip("/")


def _listing(members: list[str], unusable: int = 0) -> str:
    broken = f" ({unusable} more listed with unusable paths)" if unusable else ""
    if not members:
        return f"it serves none{broken}"
    shown = ", ".join(members[:SYSTEMS_SHOWN])
    more = f" and {len(members) - SYSTEMS_SHOWN} more" if len(members) > SYSTEMS_SHOWN else ""
    return f"it serves {shown}{more}{broken}"


_PROTOCOL_ERRORS = frozenset(
    {
        pycurl.E_FTP_WEIRD_SERVER_REPLY,  # (CURLE_WEIRD_SERVER_REPLY, 8) not HTTP/1.x
        pycurl.E_UNSUPPORTED_PROTOCOL,  # HTTP/0.9, HTTP/2 without being asked
        pycurl.E_PARTIAL_FILE,  # closed before the body its Content-Length declares
        pycurl.E_BAD_CONTENT_ENCODING,
        100,  # CURLE_TOO_LARGE (libcurl 8.6): endless headers
    }
)
_TLS_PREFIXES = ("SSL certificate problem: ", "SSL: ", "OpenSSL SSL_connect: ")


def _tls_reason(text: str) -> str:
    """libcurl's TLS text without its own prefix ("SSL certificate problem: ...")."""
    for prefix in _TLS_PREFIXES:
        if text.startswith(prefix):
            return text[len(prefix) :]
    return text


def _closed_during_tls(error: Failed) -> bool:
    """The TLS layer failed because the peer closed or reset the connection."""
    text = error.message.lower()
    return error.os_errno in (errno.ECONNRESET, errno.EPIPE) or any(
        marker in text
        for marker in ("unexpected eof", "ssl_error_syscall", "connection reset", "broken pipe")
    )


def _network_reason(error: Failed) -> str:
    """One short reason, not a traceback."""
    if error.code == pycurl.E_COULDNT_RESOLVE_HOST:
        return f"cannot resolve the host name ({cap(error.message, 200)})"
    if error.os_errno == errno.ECONNREFUSED:
        return "connection refused"
    if error.os_errno in (errno.ECONNRESET, errno.EPIPE):
        return "connection reset"
    if error.os_errno in (errno.EHOSTUNREACH, errno.ENETUNREACH):
        return "no route to host"
    text = error.message or f"curl error {error.code}"
    if "refused" in text.lower():
        return "connection refused"
    if "reset by peer" in text.lower():
        return "connection reset"
    return cap(text.translate(_UNPRINTABLE), 200)


def _close_quietly(connection: Connection) -> None:
    try:
        connection.close()
    except Exception:  # a connection already broken cannot be closed any better
        return
