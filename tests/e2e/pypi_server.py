"""PyPI, just enough of it for `pip download PROJECT`: run by the README test inside a
test-internet namespace (`ip netns exec NS python -I pypi_server.py ADDRESS LOG CERT KEY
PROJECT VERSION`); a test imports only `wheel`, to know the bytes it served.

HTTPS on ADDRESS:443 with CERT (for `pypi.org` and `files.pythonhosted.org`, signed by a test
CA), keep-alive, answering by the request's `Host` as the two real hosts do:
- `pypi.org`: `GET /simple/PROJECT/`, the PEP 503 page listing one wheel, linked at
  `https://files.pythonhosted.org/packages/...` with its sha256 (pip checks it);
- `files.pythonhosted.org`: `GET /packages/<hash>/WHEEL`, the wheel: PROJECT VERSION, pure
  Python, no dependency (so `pip download` fetches that one file), made in memory at start
  (the same bytes each time);
- anything else: 404.
Each request is recorded as a JSON line in LOG (`{"host", "path"}`): the stand-in's own record
of what reached it. Prints `ready` once bound; dies with the process that started it.

Security limitations: none needed; it only ever listens inside a namespace the tests made.
"""

from __future__ import annotations

import base64
import ctypes
import hashlib
import io
import json
import signal
import ssl
import sys
import zipfile
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

PR_SET_PDEATHSIG = 1
HTTPS_PORT = 443
INDEX, FILES = "pypi.org", "files.pythonhosted.org"
WHEEL_TIME = (2024, 1, 1, 0, 0, 0)  # fixed: the same wheel's bytes whoever makes it


def wheel(project: str, version: str) -> tuple[str, bytes]:
    """(its file name, its bytes): one module, METADATA, WHEEL and a RECORD with real hashes."""
    module = project.replace("-", "_")
    info = f"{module}-{version}.dist-info"
    files = {
        f"{module}/__init__.py": f'STAND_IN = "{project} {version}, the stand-in"\n'.encode(),
        f"{info}/METADATA": (
            f"Metadata-Version: 2.1\nName: {project}\nVersion: {version}\nRequires-Python: >=3.8\n"
        ).encode(),
        f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: lnk-test\nRoot-Is-Purelib: true\n"
        b"Tag: py3-none-any\n",
    }
    record = ""
    for name, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record += f"{name},sha256={digest},{len(data)}\n"
    files[f"{info}/RECORD"] = (record + f"{info}/RECORD,,\n").encode()
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in files.items():
            archive.writestr(zipfile.ZipInfo(name, WHEEL_TIME), data)
    return f"{module}-{version}-py3-none-any.whl", out.getvalue()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    log_path = ""
    project = ""
    wheel_name = ""
    wheel_bytes = b""

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: the record in LOG is what the tests read."""

    def _send(self, status: int, content_type: str, payload: bytes) -> None:
        self.send_response(status)
        self.send_header("content-type", content_type)
        self.send_header("content-length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def do_GET(self) -> None:
        host = (self.headers.get("host") or "").rsplit(":", 1)[0]
        with open(self.log_path, "a", encoding="utf-8") as log:
            log.write(json.dumps({"host": host, "path": self.path}) + "\n")
        digest = hashlib.sha256(self.wheel_bytes).hexdigest()
        file_path = f"/packages/{digest[:2]}/{digest[2:4]}/{digest[4:]}/{self.wheel_name}"
        if host == INDEX and self.path == f"/simple/{self.project}/":
            link = f"https://{FILES}{file_path}#sha256={digest}"
            page = (
                "<!DOCTYPE html><html><body>"
                f'<a href="{link}" data-requires-python="&gt;=3.8">{self.wheel_name}</a>'
                "</body></html>\n"
            )
            self._send(200, "text/html", page.encode())
        elif host == FILES and self.path == file_path:
            self._send(200, "application/octet-stream", self.wheel_bytes)
        else:
            self._send(404, "text/plain", b"not found\n")


def main() -> None:
    address, log, cert, key, project, version = sys.argv[1:7]
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    Handler.log_path, Handler.project = log, project
    Handler.wheel_name, Handler.wheel_bytes = wheel(project, version)
    server = ThreadingHTTPServer((address, HTTPS_PORT), Handler)
    server.daemon_threads = True
    tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    tls.load_cert_chain(cert, key)
    server.socket = tls.wrap_socket(server.socket, server_side=True)
    print("ready", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
