"""The lab's Redfish emulator: sushy-tools' own Flask application and process, with the
lab hosts' drives added (``python -m metalmend_lab.emulator --config FILE --fake``).

sushy-tools serves storage only from a static table, with a fixed model, serial number and
media type for every drive, and has no ``Drive.SecureErase``. This module replaces its
three storage views (the same URLs and shapes) with ones that serve each lab host's drives
as the host's inventory lists them (``lab.drives``), and adds what it lacks:

- ``POST .../Drives/{id}/Actions/Drive.SecureErase``: starts the erase in the lab's erase
  ledger and answers 202 with a task monitor in ``Location`` (a drive already being erased
  answers with that erase's monitor: never two);
- ``GET /redfish/v1/TaskService/TaskMonitors/{id}``: 202 and the Task while it runs, 200
  and the Task once it is over (Redfish's task monitor); ``GET
  /redfish/v1/TaskService/Tasks/{id}``: the Task;
- a drive being erased lists the erase in ``Operations`` with its ``PercentageComplete``.

The erase itself runs in a thread of this process (``EraseLedger.run_forever``), not in the
request: a client that disconnects leaves it running, and a restarted emulator picks up
the ledger where it stands. Everything else is sushy-tools unchanged (power, auth, TLS).
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import os
import re
import threading
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

from metalmend_lab.drives import DEFAULT_ERASE_SECONDS, DriveSpec, EraseLedger, EraseTask

DRIVES_KEY = "METALMEND_DRIVES"  # {system uuid: {"host": name, "drives": [DriveSpec]}}
LAB_DIR_KEY = "METALMEND_LAB_DIR"
ERASE_SECONDS_KEY = "METALMEND_ERASE_SECONDS"
POWER_DELAY_KEY = "METALMEND_POWER_DELAY"  # seconds a power change takes (POWER_DELAY_ENV)
STORAGE_ID = "1"  # each lab host has one storage subsystem
TASKS = "/redfish/v1/TaskService/Tasks"
MONITORS = "/redfish/v1/TaskService/TaskMonitors"

View = Callable[..., Any]
_ledger: EraseLedger | None = None
_ledger_lock = threading.Lock()


def ledger(app: Any) -> EraseLedger:
    """The process's one erase ledger, with the thread carrying erases out."""
    global _ledger
    with _ledger_lock:
        if _ledger is None:
            seconds = float(app.config.get(ERASE_SECONDS_KEY, DEFAULT_ERASE_SECONDS))
            _ledger = EraseLedger(Path(app.config[LAB_DIR_KEY]), seconds)
            threading.Thread(target=_ledger.run_forever, name="erases", daemon=True).start()
        return _ledger


def install(app: Any) -> None:
    """Replace sushy-tools' storage views and add the erase and task routes."""
    from sushy_tools import error
    from sushy_tools.emulator import api_utils

    def json_view(view: View) -> View:
        """sushy-tools' own wrapping: instance access checked, the answer sent as JSON."""
        return cast(View, api_utils.returns_json(api_utils.ensure_instance_access(view)))

    def json_answer(view: View) -> View:
        return cast(View, api_utils.returns_json(view))

    def host_of(identity: str) -> tuple[str, str, list[DriveSpec]]:
        system = app.systems.uuid(identity)  # sushy-tools' own lookup: 404 if unknown
        entry = app.config.get(DRIVES_KEY, {}).get(system)
        if entry is None:
            raise error.NotFound()
        return system, entry["host"], [DriveSpec(**d) for d in entry["drives"]]

    def drive_of(identity: str, storage_id: str, drive_id: str) -> tuple[str, str, DriveSpec]:
        system, host, drives = host_of(identity)
        spec = next((d for d in drives if d.id == drive_id), None)
        if storage_id != STORAGE_ID or spec is None:
            raise error.NotFound()
        return system, host, spec

    @json_view
    def storage_collection(identity: str) -> str:
        host_of(identity)
        base = f"/redfish/v1/Systems/{identity}/Storage"
        return json.dumps({
            "@odata.type": "#StorageCollection.StorageCollection",
            "@odata.id": base,
            "Name": "Storage Collection",
            "Members@odata.count": 1,
            "Members": [{"@odata.id": f"{base}/{STORAGE_ID}"}],
        })  # fmt: skip

    @json_view
    def storage(identity: str, storage_id: str) -> str:
        _, _, drives = host_of(identity)
        if storage_id != STORAGE_ID:
            raise error.NotFound()
        base = f"/redfish/v1/Systems/{identity}/Storage/{STORAGE_ID}"
        return json.dumps({
            "@odata.type": "#Storage.v1_9_0.Storage",
            "@odata.id": base,
            "Id": STORAGE_ID,
            "Name": "Local storage",
            "Status": {"State": "Enabled", "Health": "OK"},
            "Drives@odata.count": len(drives),
            "Drives": [{"@odata.id": f"{base}/Drives/{d.id}"} for d in drives],
        })  # fmt: skip

    @json_view
    def drive_resource(identity: str, stg_id: str, drv_id: str) -> str:
        system, _, spec = drive_of(identity, stg_id, drv_id)
        running = ledger(app).running_on(system, spec.id)
        path = f"/redfish/v1/Systems/{identity}/Storage/{STORAGE_ID}/Drives/{spec.id}"
        return json.dumps(drive_document(path, spec, running))

    @json_view
    def secure_erase(identity: str, stg_id: str, drv_id: str) -> Any:
        system, host, spec = drive_of(identity, stg_id, drv_id)
        task = ledger(app).start(host, system, spec.id)
        app.logger.info("secure erase of %s %s: task %s", host, spec.id, task.id)
        headers = {"Location": f"{MONITORS}/{task.id}"}
        return json.dumps(task_document(task)), 202, headers

    @json_answer
    def task_monitor(task_id: str) -> Any:
        task = ledger(app).get(task_id)
        if task is None:
            raise error.NotFound()
        if task.state == "Running":
            return json.dumps(task_document(task)), 202, {"Location": f"{MONITORS}/{task.id}"}
        return json.dumps(task_document(task))

    @json_answer
    def task_resource(task_id: str) -> str:
        task = ledger(app).get(task_id)
        if task is None:
            raise error.NotFound()
        return json.dumps(task_document(task))

    app.view_functions["storage_collection"] = storage_collection
    app.view_functions["storage"] = storage
    app.view_functions["drive_resource"] = drive_resource
    drive = "/redfish/v1/Systems/<identity>/Storage/<stg_id>/Drives/<drv_id>"
    app.add_url_rule(
        f"{drive}/Actions/Drive.SecureErase", "metalmend_secure_erase", secure_erase,
        methods=["POST"],
    )  # fmt: skip
    app.add_url_rule(f"{MONITORS}/<task_id>", "metalmend_task_monitor", task_monitor)
    app.add_url_rule(f"{TASKS}/<task_id>", "metalmend_task", task_resource)


def drive_document(path: str, spec: DriveSpec, running: EraseTask | None) -> dict[str, Any]:
    """A Redfish Drive (DMTF Drive schema) for one lab drive."""
    document: dict[str, Any] = {
        "@odata.type": "#Drive.v1_9_0.Drive",
        "@odata.id": path,
        "Id": spec.id,
        "Name": f"Drive {spec.id}",
        "CapacityBytes": spec.capacity_bytes,
        "MediaType": spec.media_type,
        "Protocol": spec.protocol,
        "Model": spec.model,
        "Manufacturer": spec.vendor,
        "SerialNumber": spec.serial_number,
        "Identifiers": [
            {"DurableNameFormat": "NAA", "DurableName": spec.wwn.removeprefix("0x").upper()}
        ],
        "Status": {"State": "Enabled", "Health": "OK"},
        "Actions": {
            "#Drive.SecureErase": {"target": f"{path}/Actions/Drive.SecureErase"},
        },
    }
    if running is not None:
        now = datetime.now(UTC).timestamp()
        document["Status"]["State"] = "Updating"
        document["Operations"] = [
            {
                "OperationName": "Sanitize",
                "PercentageComplete": running.percent(now),
                "AssociatedTask": {"@odata.id": f"{TASKS}/{running.id}"},
            }
        ]
    return document


def task_document(task: EraseTask) -> dict[str, Any]:
    """A Redfish Task (DMTF Task schema) for one erase."""
    now = datetime.now(UTC).timestamp()
    document: dict[str, Any] = {
        "@odata.type": "#Task.v1_7_0.Task",
        "@odata.id": f"{TASKS}/{task.id}",
        "Id": task.id,
        "Name": f"Secure erase of drive {task.drive}",
        "TaskState": task.state,
        "TaskStatus": "OK" if task.state != "Exception" else "Critical",
        "PercentComplete": task.percent(now),
        "StartTime": datetime.fromtimestamp(task.started, UTC).isoformat(),
        "TaskMonitor": f"{MONITORS}/{task.id}",
        "Messages": [{"Message": task.message}] if task.message else [],
    }
    return document


POWER_DELAY_ENV = "METALMEND_LAB_REDFISH_POWER_DELAY"
"""Seconds a power change takes to land, instead of sushy-tools' random 1-11 s (its fake
driver: ``int(time.time()) + random.randint(1, 11)``): for latency benchmarks, which
compare the controller with an instant BMC. A lab's ``redfish_power_delay`` (the config's
``POWER_DELAY_KEY``) is the same, and wins."""


def power_delay(config: Any, environ: Any) -> float | None:
    """The fixed power delay asked for (the config's, else the environment's); None:
    sushy-tools' own random one."""
    if (delay := config.get(POWER_DELAY_KEY)) is not None:
        return float(delay)
    return float(environ[POWER_DELAY_ENV]) if environ.get(POWER_DELAY_ENV) else None


_RESET = re.compile(r"/redfish/v1/Systems/([^/]+)/Actions/ComputerSystem\.Reset")
_JOURNALLED = {"ForceOff": "hard off", "GracefulShutdown": "soft off", "On": "on", "ForceOn": "on"}


def journal_resets(app: Any) -> None:
    """Journal every accepted ComputerSystem.Reset with the time it arrived, in
    ``<lab>/hardware/<host>.commands``, as the lab's IPMI BMCs journal their commands (the
    benchmarks read it). WSGI middleware around the Flask app: nothing of Flask imported."""
    inner = app.wsgi_app

    def journalling(environ: dict[str, Any], start_response: Any) -> Any:
        arrived = time.time()
        match = _RESET.fullmatch(environ.get("PATH_INFO", ""))
        if environ.get("REQUEST_METHOD") != "POST" or match is None:
            return inner(environ, start_response)
        body = environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0))
        environ["wsgi.input"] = io.BytesIO(body)
        statuses: list[str] = []

        def start(status: str, headers: Any, exc_info: Any = None) -> Any:
            statuses.append(status)
            return start_response(status, headers, exc_info)

        answer = inner(environ, start)
        if statuses and statuses[0].startswith("2"):
            _journal(app, match.group(1), body, arrived, _basic_user(environ))
        return answer

    app.wsgi_app = journalling


def _basic_user(environ: Mapping[str, Any]) -> str:
    """The user name of the request's HTTP Basic credentials ("" without): sushy-tools'
    authentication (outside this middleware) takes the header and says who in HTTP_X_USER."""
    if user := environ.get("HTTP_X_USER"):
        return str(user)
    scheme, _, token = str(environ.get("HTTP_AUTHORIZATION", "")).partition(" ")
    if scheme.lower() != "basic":
        return ""
    try:
        return base64.b64decode(token).decode("utf-8", "replace").partition(":")[0]
    except ValueError:
        return ""


def _journal(app: Any, identity: str, body: bytes, arrived: float, user: str = "") -> None:
    try:
        reset_type = json.loads(body or b"{}").get("ResetType")
    except (ValueError, AttributeError):
        return
    action = _JOURNALLED.get(str(reset_type))
    entry = app.config.get(DRIVES_KEY, {}).get(app.systems.uuid(identity))
    lab_dir = app.config.get(LAB_DIR_KEY)
    if action and entry and lab_dir:
        path = Path(lab_dir) / "hardware" / f"{entry['host']}.commands"
        with path.open("a") as commands:
            commands.write(f"{arrived:.6f} {action}\n")
        with path.with_suffix(".clients").open("a") as clients:  # as lab.bmcs.journal_client
            clients.write(f"{arrived:.6f} {user or '-'} {action}\n")


KEEPALIVE_ENV = "METALMEND_LAB_REDFISH_KEEPALIVE"
"""Set (to anything): serve the emulator with uvicorn, which keeps connections open as
BMCs do, instead of werkzeug's development server, which answers every request with
``Connection: close`` (each request then pays a new TCP and TLS handshake). For latency
benchmarks only: the tests read werkzeug's access log."""


def serve_with_keepalive(app: Any) -> None:
    """Make sushy-tools' ``app.run(host, port, ssl_context)`` serve through uvicorn."""

    def run(host: str, port: int, ssl_context: Any = None, **_: Any) -> None:
        import uvicorn

        cert, key = (
            app.config.get("SUSHY_EMULATOR_SSL_CERT"),
            app.config.get("SUSHY_EMULATOR_SSL_KEY"),
        )
        uvicorn.run(
            app, host=host, port=port, interface="wsgi", log_level="warning",
            ssl_certfile=cert, ssl_keyfile=key, timeout_keep_alive=60,
        )  # fmt: skip

    app.run = run


def land_power_after(delay: float) -> None:
    """Make the fake driver's power changes land ``delay`` seconds after the command."""
    from sushy_tools.emulator.resources.systems import fakedriver

    original = fakedriver.FakeDriver.set_power_state

    def set_power_state(self: Any, identity: str, state: str) -> None:
        original(self, identity, state)
        system = self._get(identity)
        pending = system.get("pending_power")
        if pending:
            self._update(system, pending_power={**pending, "apply_time": time.time() + delay})

    fakedriver.FakeDriver.set_power_state = set_power_state


def main() -> None:
    from sushy_tools.emulator import main as sushy

    install(sushy.app)
    journal_resets(sushy.app)
    if os.environ.get(KEEPALIVE_ENV):
        serve_with_keepalive(sushy.app)
    config = argparse.ArgumentParser(add_help=False)
    config.add_argument("--config")
    known, _ = config.parse_known_args()
    if known.config:  # start the erase thread now: a restarted emulator resumes erases
        sushy.app.config.from_pyfile(str(Path(known.config).resolve()))
        if LAB_DIR_KEY in sushy.app.config:
            ledger(sushy.app)
    if (delay := power_delay(sushy.app.config, os.environ)) is not None:
        land_power_after(delay)
    sushy.main()


if __name__ == "__main__":
    main()
