"""The lab's design service: the site's design documents (YAML) over https on 127.0.0.1,
at a Deckhand-shaped path, for the design reference of remove-etcd, the etcd health
endpoint and decommission (``python -m metalmend_lab.designserver FILE PORT PATH CERT
KEY``, started by ``metalmend lab up`` with a certificate of the lab's CA; see
``lab.siteetcd``). https, because metalmend serve fetches a design only from an https URL
its settings allow (the lab allows this one: docs/security.md).

The file is read on every request, so a test may change the design the lab serves.
"""

from __future__ import annotations

import contextlib
import ssl
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from metalmend_lab.controlplane import LOOPBACK


def handler(document: Path, path: str) -> type[BaseHTTPRequestHandler]:
    class Design(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path.split("?", 1)[0] != path:
                self.send_error(404, "no such design")
                return
            try:
                data = document.read_bytes()
            except OSError:
                self.send_error(503, "the design is not there")
                return
            self.send_response(200)
            self.send_header("Content-Type", "application/x-yaml")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: object) -> None:
            pass  # a request per health poll: not worth a log line

    return Design


def main() -> None:
    document, port, path = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    server = ThreadingHTTPServer((LOOPBACK, port), handler(document, path))
    tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    tls.load_cert_chain(sys.argv[4], sys.argv[5])
    server.socket = tls.wrap_socket(server.socket, server_side=True)
    server.daemon_threads = True
    with contextlib.suppress(KeyboardInterrupt):
        server.serve_forever()


if __name__ == "__main__":
    main()
