"""The libcurl multi's callbacks when its event loop is gone (bmc/curl.py, ``CurlLoop``).

libcurl may stop watching a socket, or ask for a timer, from inside the garbage collector:
a transfer or a connection collected in the same cycle as its loop, after the loop's weak
reference was cleared (a test's loop at its end, a process's last moments). The callbacks
then have nothing to watch with and nobody to report to (an exception raised there is
"unraisable": a warning in a test run, noise in a log): they forget the socket and return.
"""

from __future__ import annotations

import asyncio
import gc
import socket
import sys
from typing import Any

import pycurl
import pytest

from metalmend.bmc.curl import CurlLoop


def test_a_socket_watched_on_a_loop_that_is_gone_is_forgotten_quietly(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    unraisable: list[Any] = []
    monkeypatch.setattr(sys, "unraisablehook", unraisable.append)
    loop = asyncio.new_event_loop()
    multi = CurlLoop(loop)
    ours, theirs = socket.socketpair()
    try:
        multi._socket(pycurl.POLL_INOUT, ours.fileno(), None, None)  # a transfer under way
        assert multi._watched == {ours.fileno(): 3}
        loop.close()
        del loop
        gc.collect()
        with pytest.raises(RuntimeError, match="event loop of this CurlMulti is gone"):
            multi.loop  # noqa: B018 - what the callbacks must not reach for
        multi._socket(pycurl.POLL_REMOVE, ours.fileno(), None, None)
        assert multi._watched == {}
        multi._socket(pycurl.POLL_IN, ours.fileno(), None, None)  # nothing to watch it with
        assert multi._watched == {}
        multi._timer(10)  # nor to call back on
        assert multi._timer_handle is None
        multi._timer(-1)
    finally:
        ours.close()
        theirs.close()
    assert unraisable == []


def test_a_socket_on_a_closed_loop_is_forgotten_too() -> None:
    loop = asyncio.new_event_loop()
    multi = CurlLoop(loop)
    ours, theirs = socket.socketpair()
    try:
        multi._socket(pycurl.POLL_IN, ours.fileno(), None, None)
        loop.close()
        multi._socket(pycurl.POLL_REMOVE, ours.fileno(), None, None)
        assert multi._watched == {}
        multi._timer(10)
        assert multi._timer_handle is None
    finally:
        ours.close()
        theirs.close()
