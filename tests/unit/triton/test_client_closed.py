"""drive_closed against a small local HTTP server that stands in for Triton's frontend: a stray
error is sent once more, and a server that stops answering ends the loop after the requests
already in flight instead of costing the request timeout for every ticket left."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest

pytest.importorskip("aiohttp")

from schedsim.triton.client import drive_closed


class _Frontend:
    """Answers POSTs 200 with a small body; ``errors`` lists the posts (1-based) answered 404;
    from post ``hang_after + 1`` on it accepts the request and never answers (until closed)."""

    def __init__(self, errors=(), hang_after: int | None = None):
        self.posts = 0
        self.lock = threading.Lock()
        self.release = threading.Event()
        frontend = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self):
                self.rfile.read(int(self.headers["Content-Length"]))
                with frontend.lock:
                    frontend.posts += 1
                    k = frontend.posts
                if hang_after is not None and k > hang_after:
                    frontend.release.wait(30)
                    return
                status, body = (404, b'{"error":"model not found"}') if k in errors else (200, b"{}")
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"127.0.0.1:{self.httpd.server_address[1]}"

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.release.set()
        self.httpd.shutdown()
        self.httpd.server_close()


def test_a_stray_error_is_sent_once_more_and_its_row_keeps_the_answer():
    with _Frontend(errors={3}) as srv:
        rec = drive_closed(srv.url, "m", 8, clients=2, requests=10, request_timeout_s=10)
    assert srv.posts == 11
    assert (rec.http_status == 200).all()
    assert (rec.answered_ns > 0).all()
    assert rec.error == [""] * 10


def test_a_server_that_stops_answering_ends_the_loop_after_the_requests_in_flight():
    clients, requests, answered = 3, 200, 12
    with _Frontend(hang_after=answered) as srv:
        rec = drive_closed(srv.url, "m", 8, clients=clients, requests=requests, request_timeout_s=0.5)
        posts = srv.posts
    # each client's one request in flight when the server hung, none sent again, no ticket after
    assert posts == answered + clients
    assert int((rec.http_status == 200).sum()) == answered
    unanswered = np.flatnonzero(rec.http_status != 200)
    assert unanswered.size == requests - answered
    assert int((rec.answered_ns[unanswered] > 0).sum()) == clients  # timed out, marked with an error
    assert all(rec.error[j] for j in unanswered if rec.answered_ns[j] > 0)
    assert (rec.sent_ns[unanswered][rec.answered_ns[unanswered] < 0] == -1).all()  # never sent
