"""A fix for pyghmi's lost wake-up: an answer that arrives before its reader waits for it
was left unread until the retransmission timer (0.5-1 s) ran out.

pyghmi (1.6) reads every socket in one IO thread; a thread that wants an answer calls
``session._io_wait``, which queues a (deadline, event, address) item for the IO thread
and blocks on the event. The IO thread wakes a queued item only when a datagram from its
address arrives *after* the item was queued. On loopback or a LAN a BMC answers in a
fraction of a millisecond, often before the client has queued its item: the IO thread
has already moved the answer to the session's ``pktqueue`` (and to ``sessionqueue``), so
nothing wakes the client until its deadline, the retransmission timer
(``initialtimeout`` 0.5 s plus up to 0.5 s at random). Then it finds the answer that had
been waiting all along. The same race stalls pyghmi's BMC side (``Bmc.listen``, used by
the lab's IPMI BMCs) until the client's retransmission arrives.

Measured on this machine, one session, 1,000 Get Chassis Status round trips against the
lab's BMC: 6 took 0.5-0.9 s (every one a retransmission interval); ipmitool's shell on
the same BMC, none. With ``install()`` in both processes: none over 20 ms.

``install()`` replaces ``_io_wait`` with the same wait that first checks whether the
answer is already queued, *after* queuing its item: an answer read before that point is
in a queue the check sees, and one read after it is matched to the item by the IO thread
as before, so no ordering of the two threads loses a wake-up. A woken item stays queued
for the IO thread, which sets its (already set) event once more: harmless, as pyghmi's
own stale items are.
"""

from __future__ import annotations

import threading
from typing import Any

from pyghmi.ipmi.private import session as ipmi_session


def _answer_queued(address: Any) -> bool:
    """Has the IO thread already queued a datagram from ``address`` (None: any) for a
    session to process?"""
    if address is None:
        return bool(ipmi_session.sessionqueue)
    handlers = ipmi_session.Session.bmc_handlers.get(address)
    if not handlers:
        return False
    try:
        sessions = list(handlers.values())
    except RuntimeError:  # changed by another thread mid-copy: wait as pyghmi would
        return False
    return any(getattr(s, "pktqueue", None) for s in sessions)


def _io_wait(timeout: float, myaddr: Any = None, evq: Any = None) -> None:
    """pyghmi's ``_io_wait``, without the lost wake-up (module docstring)."""
    event = threading.Event()
    if evq is not None:
        evq.append(event)
    deadline = timeout + ipmi_session._monotonic_time()
    ipmi_session.ioqueue.append((deadline, event, myaddr))
    if _answer_queued(myaddr):
        event.set()
    elif deadline < ipmi_session.selectdeadline:
        # As pyghmi: a deadline sooner than the IO thread's select wakes it to look.
        wakeup = ipmi_session.iosockets[0]
        wakeup.sendto(b"\x01", (ipmi_session.myself, wakeup.getsockname()[1]))
    event.wait()


def install() -> None:
    """Replace pyghmi's ``_io_wait`` in this process (idempotent)."""
    ipmi_session._io_wait = _io_wait
