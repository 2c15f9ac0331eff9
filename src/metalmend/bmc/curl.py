"""HTTP/1.1 to BMCs through libcurl's multi interface, driven by the asyncio loop: the
Redfish driver's transport (bmc/redfish.py says what it sends and why).

Why libcurl: a routine power read is a new TCP and TLS connection every poll (BMCs close
idle connections long before the next one), and through httpx two thirds of its CPU were
httpcore's and anyio's Python layers, not TLS. libcurl does the connection, TLS and HTTP
in C; Python only sees the answer (``benchmarks/bmc_poll_cpu.py`` measures both against a
bare ``ssl`` socket; docs/scale.md has the figures).

How it is driven: one ``CurlMulti`` per event loop and certificate check (``Trust``).
libcurl says which sockets to watch (``M_SOCKETFUNCTION``: ``loop.add_reader`` /
``add_writer``) and when to be called back (``M_TIMERFUNCTION``: ``loop.call_later``);
nothing blocks and no thread is started. A multi is per trust because libcurl caches the
parsed CA store on the multi, keyed by the file's path only: a bundle rewritten in place
(rotated) gets a new multi, and so is loaded again, while every driver of one bundle shares
one parsed store (one per driver was most of the controller's start-up CPU and memory at a
thousand hosts, benchmarks/scale.py).

One ``Connection`` per driver: an easy handle and a ``CurlShare`` holding that driver's
connection cache, so a driver reuses only its own connection and closing it (``close``)
really closes the socket at once, never another driver's.

Safety, all set on every handle: proxies never (``PROXY ""``, ``NOPROXY "*"``: libcurl
otherwise reads ``https_proxy`` from the environment), redirects never followed, only the
scheme of the address allowed, TLS 1.2 at least, the certificate checked against the
``Trust`` only (the wheel's compiled-in CA path is replaced, never added to), the vetted IP
dialled through ``CONNECT_TO`` while the URL, SNI, ``Host`` and the certificate check keep
the BMC's name, HTTP/1.1 only, no signals. The answer is read by a callback that stops the
transfer past the byte limit. Credentials are set as libcurl options (never in a URL or a
header text of ours) and libcurl's verbose output is never turned on.
"""

from __future__ import annotations

import asyncio
import functools
import os
import ssl
import weakref
from dataclasses import dataclass, field
from typing import Any, Final

import pycurl

from metalmend.bmc.errors import BmcError

HEADERS_KEPT: Final = frozenset({b"content-length", b"content-encoding", b"location"})
"""The answer's headers the driver reads; no other header is kept (a hostile BMC's
headers are bounded by libcurl, and not copied)."""

MAX_IDLE_CONNECTIONS: Final = 1
"""Connections a driver keeps open: one BMC, one call at a time (the pool's slots)."""


@dataclass(frozen=True)
class Trust:
    """How a BMC's certificate is checked: not at all (``verify`` False), or against
    ``cafile`` (a PEM file), ``capath`` (an OpenSSL hashed directory) or ``blob`` (PEM
    text), each None when not used. ``stamp`` identifies the files' contents on disk."""

    verify: bool
    cafile: str | None = None
    capath: str | None = None
    blob: bytes | None = field(default=None, repr=False)
    stamp: tuple[tuple[int, int, int], ...] = ()


NO_CHECK: Final = Trust(verify=False)


def trust_for(ca_bundle: str | None, *, system_cas: bool = True) -> Trust:
    """The certificate check of a driver trusting ``ca_bundle`` and, when ``system_cas``
    (or without a bundle), the system's CA store: the same files Python's
    ``ssl.create_default_context`` loads (``SSL_CERT_FILE``/``SSL_CERT_DIR`` honoured).
    A bundle that is missing or not PEM certificates is an error here, before anything is
    sent; the answer is cached by the bundle's identity on disk (a rewritten bundle makes a
    new ``Trust``, hence a new multi and a fresh load)."""
    stamp: tuple[tuple[int, int, int], ...] = ()
    if ca_bundle is not None:
        try:
            found = os.stat(ca_bundle)
        except OSError as error:
            raise BmcError(f"cannot load the BMC CA bundle {ca_bundle}: {error.strerror}") from None
        stamp = ((found.st_ino, found.st_mtime_ns, found.st_size),)
    return _trust(ca_bundle, stamp, system_cas or ca_bundle is None)


@functools.lru_cache(maxsize=8)
def _trust(ca_bundle: str | None, stamp: tuple[tuple[int, int, int], ...], system: bool) -> Trust:
    """(``stamp`` only keys the cache.) A failure is raised, not cached."""
    if ca_bundle is not None:
        try:  # the same check, and message, as Python's own loading of the bundle
            ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_verify_locations(cafile=ca_bundle)
        except (OSError, ssl.SSLError) as error:
            raise BmcError(
                f"cannot load the BMC CA bundle {ca_bundle}:"
                f" {getattr(error, 'strerror', None) or error}"
            ) from None
    if not system:
        return Trust(verify=True, cafile=ca_bundle, stamp=stamp)
    paths = ssl.get_default_verify_paths()
    cafile = paths.cafile if paths.cafile and os.path.isfile(paths.cafile) else None
    capath = paths.capath if paths.capath and os.path.isdir(paths.capath) else None
    if ca_bundle is None:
        # One file when the system has one: libcurl caches a store read from a file only.
        return Trust(verify=True, cafile=cafile, capath=None if cafile else capath)
    if capath is not None:  # the bundle as the file, the system's CAs looked up by hash
        return Trust(verify=True, cafile=ca_bundle, capath=capath, stamp=stamp)
    pem = b""
    for name in (cafile, ca_bundle):
        if name is not None:
            with open(name, "rb") as source:
                pem += source.read().rstrip(b"\n") + b"\n"
    return Trust(verify=True, blob=pem, stamp=stamp)


# ---- the loop's side --------------------------------------------------------------------


class CurlLoop:
    """One CurlMulti on one asyncio loop: libcurl says which sockets to watch and when to
    call it back; a finished transfer resolves its future."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        # Weakly: the table of multis is keyed weakly by the loop, and must not keep it.
        self._loop = weakref.ref(loop)
        self.multi = pycurl.CurlMulti()
        self.multi.setopt(pycurl.M_SOCKETFUNCTION, self._socket)
        self.multi.setopt(pycurl.M_TIMERFUNCTION, self._timer)
        self._timer_handle: asyncio.TimerHandle | None = None
        self._waiting: dict[Any, asyncio.Future[int]] = {}
        self._watched: dict[int, int] = {}  # fd -> 1 (read) | 2 (write)

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        loop = self._loop()
        if loop is None:  # a transfer started on a multi whose loop is gone: a bug
            raise RuntimeError("the event loop of this CurlMulti is gone")
        return loop

    def _open_loop(self) -> asyncio.AbstractEventLoop | None:
        """The loop, unless it is closed or gone: libcurl may call back from the garbage
        collector, a transfer collected in one cycle with its loop (a test's loop at its
        end, a process's last moments). Nothing is left to watch or call back then, and an
        exception raised inside a callback reaches nobody."""
        loop = self._loop()
        return None if loop is None or loop.is_closed() else loop

    def _socket(self, what: int, fd: int, _multi: Any, _data: Any) -> None:
        old = self._watched.pop(fd, 0)
        loop = self._open_loop()
        if loop is None:  # the selector went with the loop: the socket is forgotten
            return
        if old & 1:
            loop.remove_reader(fd)
        if old & 2:
            loop.remove_writer(fd)
        if what == pycurl.POLL_REMOVE:
            return
        flags = 0
        if what in (pycurl.POLL_IN, pycurl.POLL_INOUT):
            loop.add_reader(fd, self._act, fd, pycurl.CSELECT_IN)
            flags |= 1
        if what in (pycurl.POLL_OUT, pycurl.POLL_INOUT):
            loop.add_writer(fd, self._act, fd, pycurl.CSELECT_OUT)
            flags |= 2
        self._watched[fd] = flags

    def _timer(self, ms: int) -> None:
        if self._timer_handle is not None:
            self._timer_handle.cancel()
            self._timer_handle = None
        loop = self._open_loop()
        if ms >= 0 and loop is not None:
            self._timer_handle = loop.call_later(ms / 1000, self._act, pycurl.SOCKET_TIMEOUT, 0)

    def _act(self, fd: int, event: int) -> None:
        self.multi.socket_action(fd, event)
        while True:
            queued, ok, failed = self.multi.info_read()
            for handle in ok:
                self._finish(handle, 0)
            for handle, code, _message in failed:
                self._finish(handle, code)
            if not queued:
                return

    def _finish(self, handle: Any, code: int) -> None:
        self.multi.remove_handle(handle)
        done = self._waiting.pop(handle, None)
        if done is not None and not done.done():
            done.set_result(code)

    def abandon(self, handle: Any) -> None:
        """End ``handle``'s transfer now, if it is under way (its connection is closed)."""
        done = self._waiting.pop(handle, None)
        if done is not None:
            self.multi.remove_handle(handle)
            done.cancel()

    async def perform(self, handle: Any) -> int:
        """Run the transfer; its curl result code (0: done). Cancelled, the transfer is
        removed from the multi at once, which closes its connection."""
        done: asyncio.Future[int] = self.loop.create_future()
        self._waiting[handle] = done
        self.multi.add_handle(handle)
        try:
            self._act(pycurl.SOCKET_TIMEOUT, 0)
            return await done
        finally:
            if self._waiting.pop(handle, None) is not None:  # cancelled: not finished
                self.multi.remove_handle(handle)


_LOOPS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[Trust, CurlLoop]] = (
    weakref.WeakKeyDictionary()
)


def curl_loop(trust: Trust) -> CurlLoop:
    """The running loop's multi for ``trust``. A trust replaced (a rotated bundle: same
    files, new stamp) drops the old multi from the table; drivers using it keep it."""
    loop = asyncio.get_running_loop()
    table = _LOOPS.setdefault(loop, {})
    found = table.get(trust)
    if found is None:
        for old in [t for t in table if t.cafile == trust.cafile and t.stamp != trust.stamp]:
            del table[old]
        found = table[trust] = CurlLoop(loop)
    return found


# ---- one driver's connection ------------------------------------------------------------


@dataclass
class Response:
    """An answer as read: ``body`` is at most ``limit`` bytes; ``complete`` False when the
    answer was larger (or declared itself larger) and only its start was read."""

    status: int = 0
    body: bytearray = field(default_factory=bytearray)
    complete: bool = True
    headers: dict[str, str] = field(default_factory=dict)
    """The headers of HEADERS_KEPT, by lower-case name."""
    encoding_refused: str | None = None
    """The Content-Encoding the BMC answered in, when not identity (not read further)."""


class Failed(Exception):
    """A transfer failed: libcurl's result code and text, the OS error number libcurl
    saw, and whether a connection was made (a TCP connect completed)."""

    def __init__(self, code: int, message: str, os_errno: int, connected: bool) -> None:
        super().__init__(message)
        self.code, self.message, self.os_errno, self.connected = code, message, os_errno, connected


class Connection:
    """One driver's connection to its BMC (libcurl keeps it open between requests; a
    connection the BMC closed while idle is noticed before reuse and replaced, and a
    request that finds a reused connection dead before any answer is sent again on a new
    one, by libcurl)."""

    def __init__(
        self,
        trust: Trust,
        *,
        scheme: str,
        username: str,
        password: str,
        timeout: float,
        connect_to: str | None,
    ) -> None:
        self._loop = curl_loop(trust)
        self._share: Any = None  # made at the first request after a hang-up
        handle = self._handle = pycurl.Curl()
        handle.setopt(pycurl.NOSIGNAL, 1)
        handle.setopt(pycurl.PROXY, "")
        handle.setopt(pycurl.NOPROXY, "*")
        handle.setopt(pycurl.FOLLOWLOCATION, 0)
        allowed = pycurl.PROTO_HTTPS if scheme == "https" else pycurl.PROTO_HTTP
        handle.setopt(pycurl.PROTOCOLS, allowed)
        handle.setopt(pycurl.REDIR_PROTOCOLS, allowed)
        handle.setopt(pycurl.HTTP_VERSION, pycurl.CURL_HTTP_VERSION_1_1)
        handle.setopt(pycurl.MAXCONNECTS, MAX_IDLE_CONNECTIONS)
        handle.setopt(pycurl.CONNECTTIMEOUT_MS, max(1, int(timeout * 1000)))
        handle.setopt(pycurl.TIMEOUT_MS, max(1, int(timeout * 1000)))
        handle.setopt(pycurl.HTTPAUTH, pycurl.HTTPAUTH_BASIC)
        handle.setopt(pycurl.USERNAME, username)
        handle.setopt(pycurl.PASSWORD, password)
        handle.setopt(pycurl.USERAGENT, "metalmend")
        if connect_to is not None:
            handle.setopt(pycurl.CONNECT_TO, [connect_to])
        if scheme == "https":
            handle.setopt(pycurl.SSLVERSION, pycurl.SSLVERSION_TLSv1_2)
            if not trust.verify:
                handle.setopt(pycurl.SSL_VERIFYPEER, 0)
                handle.setopt(pycurl.SSL_VERIFYHOST, 0)
            else:
                handle.setopt(pycurl.SSL_VERIFYPEER, 1)
                handle.setopt(pycurl.SSL_VERIFYHOST, 2)
                # Only the trust's sources: the wheel's compiled-in defaults are replaced.
                handle.unsetopt(pycurl.CAINFO)
                handle.unsetopt(pycurl.CAPATH)
                if trust.cafile is not None:
                    handle.setopt(pycurl.CAINFO, trust.cafile)
                if trust.capath is not None:
                    handle.setopt(pycurl.CAPATH, trust.capath)
                if trust.blob is not None:
                    handle.setopt(pycurl.CAINFO_BLOB, trust.blob)
        self._busy = False
        self._one_at_a_time = asyncio.Lock()

    async def request(
        self, method: str, url: str, headers: list[str], body: bytes | None, limit: int
    ) -> Response:
        """One request; the answer's body read up to ``limit`` bytes. Raises ``Failed``.
        Requests of one connection take turns (one easy handle, one transfer at a time)."""
        async with self._one_at_a_time:
            return await self._request(method, url, headers, body, limit)

    async def _request(
        self, method: str, url: str, headers: list[str], body: bytes | None, limit: int
    ) -> Response:
        handle = self._handle
        if handle is None:
            raise Failed(pycurl.E_FAILED_INIT, "the connection was closed", 0, False)
        if self._share is None:
            self._share = pycurl.CurlShare()
            self._share.setopt(pycurl.SH_SHARE, pycurl.LOCK_DATA_CONNECT)
            handle.setopt(pycurl.SHARE, self._share)
        answer = Response()

        def header(line: bytes) -> int | None:
            if line.startswith(b"HTTP/"):  # a status line: a new answer (after a 100)
                parts = line.split(None, 2)
                answer.status = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0
                answer.headers.clear()
                return None
            name, colon, value = line.partition(b":")
            if colon:
                name = name.strip().lower()
                if name in HEADERS_KEPT:
                    answer.headers[name.decode("latin-1")] = value.strip().decode("latin-1")
                return None
            if line.strip() or 100 <= answer.status < 200:
                return None
            # The end of the headers: refuse what would not be read anyway.
            encoding = answer.headers.get("content-encoding", "identity").strip().lower()
            if encoding not in ("", "identity"):
                answer.encoding_refused = encoding
                return 0  # stops the transfer
            declared = answer.headers.get("content-length", "")
            if declared.isdigit() and int(declared) > limit and 200 <= answer.status < 300:
                answer.complete = False  # errors are read (their start says what went wrong)
                return 0
            return None

        def write(chunk: bytes) -> int | None:
            room = limit - len(answer.body)
            if len(chunk) > room:
                answer.body += chunk[:room]
                answer.complete = False
                return 0  # stops the transfer; the connection is closed, not drained
            answer.body += chunk
            return None

        handle.setopt(pycurl.URL, url)
        # A request with a body (a reset, an erase) goes on a new connection: libcurl sends a
        # request again, once, when a kept connection turns out closed before any answer,
        # and a BMC that received a reset and then hung up (its idle timer fired as the
        # request came) would get it twice. Reads may be sent again; actions never.
        handle.setopt(pycurl.FRESH_CONNECT, 0 if body is None else 1)
        if body is None:
            handle.setopt(pycurl.HTTPGET, 1)
        else:
            handle.setopt(pycurl.POSTFIELDS, body)
            if method != "POST":
                handle.setopt(pycurl.CUSTOMREQUEST, method)
        handle.setopt(pycurl.HTTPHEADER, headers)
        handle.setopt(pycurl.HEADERFUNCTION, header)
        handle.setopt(pycurl.WRITEFUNCTION, write)
        self._busy = True
        try:
            code = await self._loop.perform(handle)
        finally:
            self._busy = False
            handle.setopt(pycurl.HEADERFUNCTION, _ignore)  # no cycle through the answer
            handle.setopt(pycurl.WRITEFUNCTION, _ignore)
            if body is not None and method != "POST":
                handle.unsetopt(pycurl.CUSTOMREQUEST)
        stopped_by_us = code == pycurl.E_WRITE_ERROR and (
            not answer.complete or answer.encoding_refused is not None
        )
        if code != 0 and not stopped_by_us:
            raise Failed(
                code,
                handle.errstr() or f"curl error {code}",
                int(handle.getinfo(pycurl.OS_ERRNO)),
                float(handle.getinfo(pycurl.CONNECT_TIME)) > 0,
            )
        return answer

    def hang_up(self) -> None:
        """Close the open connection at once; the handle and its options stay for the
        next request, which connects again. Only between requests (``busy`` False)."""
        share, self._share = self._share, None
        if share is None or self._handle is None:
            return
        self._handle.unsetopt(pycurl.SHARE)
        share.close()  # closes the connections it holds (no wait for the BMC's goodbye)

    def close(self) -> None:
        """Close the connection at once (a transfer under way is ended first) and free
        the handle; never raises."""
        handle = self._handle
        if handle is None:
            return
        try:
            self._loop.abandon(handle)
            self.hang_up()
        finally:
            self._handle = None
            handle.close()

    @property
    def busy(self) -> bool:
        return self._busy

    @property
    def connected(self) -> bool:
        """A connection may be open (made since the last hang-up)."""
        return self._share is not None


def _ignore(data: bytes) -> None:
    return None
