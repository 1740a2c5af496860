"""A small HTTP server on 127.0.0.1 for the download tests, and a guard against any other host.

Downloads in the tests go through the real path (pooch, requests, retries, the temporary file and
the hash check); only the host differs: a `PinnedSource` is pointed at the local server with
`local_source`, and the server answers `/<repository>/<commit>/<path>` like raw.githubusercontent.com.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace
from typing import TypeVar
from urllib.parse import urlsplit

import pooch
import pytest
import requests

from gors.core.data import GITHUB_RAW, PinnedSource
from gors.core.hub import OFFLINE_VARIABLES

LOCAL_HOST = "127.0.0.1"


class FileServer(ThreadingHTTPServer):
    """Serves `files` (URL path -> bytes) and records every requested path.

    `failures` requests from now on are answered 503 (a transient server error), then files are
    served again; an unknown path is a 404.
    """

    def __init__(self) -> None:
        super().__init__((LOCAL_HOST, 0), _Handler)
        self.files: dict[str, bytes] = {}
        self.requests: list[str] = []
        self.failures = 0

    @property
    def url(self) -> str:
        return f"http://{LOCAL_HOST}:{self.server_address[1]}"

    def put(self, source: PinnedSource, filename: str, data: bytes) -> str:
        """Serve `data` as `filename` of `source`; returns its request path."""
        path = f"/{source.repository}/{source.commit}/{source.folder}{filename}"
        self.files[path] = data
        return path


class _Handler(BaseHTTPRequestHandler):
    server: FileServer

    def do_GET(self) -> None:  # the name http.server dispatches GET requests to
        self.server.requests.append(self.path)
        data = self.server.files.get(self.path)
        if self.server.failures > 0:
            self.server.failures -= 1
            self.send_error(503)
        elif data is None:
            self.send_error(404)
        else:
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    def log_message(self, format: str, *args: object) -> None:
        """Quiet: pytest shows the assertions, not an access log."""


S = TypeVar("S", bound=ThreadingHTTPServer)


@contextmanager
def serving(server: S) -> Iterator[S]:
    """`server` answering on a thread of its own, shut down and its socket closed when the block ends."""
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


@contextmanager
def file_server() -> Iterator[FileServer]:
    """A running `FileServer`, shut down and its socket closed when the block ends."""
    with serving(FileServer()) as server:
        yield server


def local_source(source: PinnedSource, base_url: str) -> PinnedSource:
    """`source` downloaded from `base_url` instead of GitHub, under the same `/<repo>/<commit>/<path>`."""
    return dataclasses.replace(source, url_pattern=base_url + "/{repository}/{commit}/{path}")


def github_url(path: str) -> str:
    """The GitHub raw URL a request path of the local server stands for."""
    return GITHUB_RAW.split("/{repository}")[0] + path


def forbid_internet(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail any HTTP request (through requests, which pooch uses) to a host other than 127.0.0.1, and lift
    the offline switch conftest sets (gors downloads nothing under it): the download tests are online, to
    this host only."""
    for variable in OFFLINE_VARIABLES:
        monkeypatch.delenv(variable, raising=False)
    send = requests.Session.send

    def local_only(session: requests.Session, request: requests.PreparedRequest, **kwargs: object):
        if urlsplit(request.url).hostname != LOCAL_HOST:
            raise AssertionError(f"network access attempted: {request.url}")
        return send(session, request, **kwargs)

    monkeypatch.setattr(requests.Session, "send", local_only)


def record_retry_waits(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """Make pooch's waits between download attempts instant; returns the list of waits asked for."""
    waits: list[float] = []
    monkeypatch.setattr(pooch.core, "time", SimpleNamespace(sleep=waits.append))
    return waits
