from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from rollstream.workers.rewards import HttpRewardClient, RewardError


class _State:
    def __init__(self, fail_first: int = 0, slow_call: int | None = None, status: int = 503) -> None:
        self.fail_first, self.slow_call, self.status = fail_first, slow_call, status
        self.calls: list[dict[str, Any]] = []
        self.lock = threading.Lock()


def _handler(state: _State) -> type[BaseHTTPRequestHandler]:
    class H(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            with state.lock:
                state.calls.append(body)
                n = len(state.calls)
            if n <= state.fail_first:
                self.send_response(state.status)
                self.end_headers()
                return
            if n == state.slow_call:
                time.sleep(0.6)  # longer than the client timeout
            payload = json.dumps({"reward": 0.75}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, *args: Any) -> None:
            pass

    return H


@pytest.fixture
def server(request: pytest.FixtureRequest) -> Iterator[tuple[str, _State]]:
    state = _State(**getattr(request, "param", {}))
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _handler(state))
    th = threading.Thread(target=srv.serve_forever, daemon=True)
    th.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}/reward", state
    srv.shutdown()
    srv.server_close()
    th.join()


@pytest.mark.parametrize("server", [{"fail_first": 2, "slow_call": 3}], indirect=True)
def test_retries_5xx_and_timeout_with_same_key(server: tuple[str, _State]) -> None:
    url, state = server
    client = HttpRewardClient(url, timeout_s=0.3, retries=3, backoff_s=0.01)
    assert client.score("traj-1", "math", "38", {"ground_truth": "38"}) == 0.75
    assert len(state.calls) == 4  # 503, 503, timeout, ok
    assert {c["idempotency_key"] for c in state.calls} == {"traj-1"}
    assert state.calls[0] == {
        "idempotency_key": "traj-1",
        "domain": "math",
        "response": "38",
        "info": {"ground_truth": "38"},
    }


@pytest.mark.parametrize("server", [{"fail_first": 10}], indirect=True)
def test_gives_up_after_retries(server: tuple[str, _State]) -> None:
    url, state = server
    with pytest.raises(RewardError, match="503"):
        HttpRewardClient(url, retries=2, backoff_s=0.01).score("t", "code", "", {})
    assert len(state.calls) == 3


@pytest.mark.parametrize("server", [{"fail_first": 10, "status": 400}], indirect=True)
def test_client_error_is_not_retried(server: tuple[str, _State]) -> None:
    url, state = server
    with pytest.raises(RewardError, match="400"):
        HttpRewardClient(url, retries=3, backoff_s=0.01).score("t", "code", "", {})
    assert len(state.calls) == 1


def test_connection_refused_is_retried_then_raises() -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, not listening: connections are refused
        t0 = time.monotonic()
        with pytest.raises(RewardError, match="3 attempts"):
            HttpRewardClient(f"http://127.0.0.1:{port}/", retries=2, backoff_s=0.05).score("t", "m", "", {})
        assert time.monotonic() - t0 >= 0.15  # backoff 0.05 + 0.1
