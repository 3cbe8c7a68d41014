"""The box tells a person by itself: a real runner process (no watcher anywhere) POSTs its incidents to --notify
URLs and pings --ping every period; both received by an HTTP server on loopback inside the test."""

from __future__ import annotations

import importlib.util
import json
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from runner.alerts.book import BOOK_FILE
from runner.alerts.notify import BadTarget, Outbox, target
from tests.conftest import RunnerProcess, wait_for, write_job
from tests.inprocess import plan_main
from tests.sshd import IN_CI


class Received:
    """What the loopback server was sent: (path, headers, body) of each request, in order."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, dict[str, str], bytes]] = []
        self.lock = threading.Lock()

    def on(self, path: str) -> list[tuple[dict[str, str], bytes]]:
        with self.lock:
            return [(h, b) for p, h, b in self.requests if p == path]


@pytest.fixture
def receiver() -> Iterator[tuple[str, Received]]:
    got = Received()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            with got.lock:
                got.requests.append((self.path, dict(self.headers), body))
            self.send_response(500 if self.path == "/broken" else 200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"127.0.0.1:{server.server_address[1]}", got
    server.shutdown()
    server.server_close()
    thread.join()


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_the_runner_notifies_and_pings_with_no_watcher_and_an_ack_silences_it(
    queue_root: Path, runner: RunnerProcess, receiver: tuple[str, Received]
) -> None:
    where, got = receiver
    dead = _closed_port()
    write_job(queue_root, "65-gate.job", "# LANE=cpu\necho 'gate failed: boom-7'; exit 3\n")
    runner.start(
        "--host-name",
        "a9",
        "--notify",
        f"http://{where}/hook",
        "--notify",
        f"ntfy://{where}/a9-queue",
        "--notify",
        f"http://127.0.0.1:{dead}/nobody",  # refused: retried, counted, and the runner goes on
        "--ping",
        f"http://{where}/ping",
        "--ping-every",
        "0.3",
        "--realert",
        "1",
    )
    wait_for(lambda: got.on("/hook") and got.on("/a9-queue"), 15)
    headers, body = got.on("/hook")[0]
    sent = json.loads(body)
    assert headers["Content-Type"] == "application/json"
    assert sent["what"] == "open" and sent["kind"] == "failed" and sent["host"] == "a9"
    assert sent["message"].startswith("a9: 65-gate.job failed: exited 3: gate failed: boom-7 (open ")
    assert sent["message"].endswith("look: plan logs a9 65-gate.job)")
    headers, body = got.on("/a9-queue")[0]  # ntfy's form: the message as text, the title as a header
    assert headers["Title"] == "failed on a9" and headers["Priority"] == "high"
    assert body.decode().startswith("a9: 65-gate.job failed: exited 3")
    wait_for(lambda: len(got.on("/ping")) >= 3, 15)  # every period, with the open incident in its body
    assert b"1 open: 65-gate.job failed" in got.on("/ping")[-1][1]
    wait_for(lambda: any(json.loads(b)["what"] == "repeat" for _, b in got.on("/hook")), 15)  # --realert 1

    write_job(queue_root, "ack-x", json.dumps({"by": "me", "target": "failed:65-*", "until": None}), state="control")
    wait_for(lambda: json.loads((queue_root / BOOK_FILE).read_text())["open"][0]["acked"], 15)
    hooks = len(got.on("/hook"))
    pings = len(got.on("/ping"))
    wait_for(lambda: len(got.on("/ping")) >= pings + 8, 15)  # 2.4 s of pings: two --realert periods
    assert len(got.on("/hook")) in (hooks, hooks + 1)  # at most one already on its way when the ack landed
    assert b"ok, no open incident" in got.on("/ping")[-1][1]

    delivery = json.loads((queue_root / "status.json").read_text())["delivery"]
    assert delivery["failed_tries"] >= 1 and "nobody" in delivery["last_error"]
    assert delivery["sent"] >= 4 and delivery["notify"][2] == f"http://127.0.0.1:{dead}/nobody"


def test_a_failing_receiver_is_tried_again_with_backoff_then_given_up(receiver: tuple[str, Received]) -> None:
    where, got = receiver
    box = Outbox(timeout=5.0, backoff=(0.05, 0.1))
    box.notify([target(f"http://{where}/broken")], {"what": "open", "message": "m"})
    wait_for(lambda: box.counts.given_up == 1, 10)
    assert len(got.on("/broken")) == 3 and box.counts.failed_tries == 3
    assert box.status()["last_error"] == f"notify http://{where}/broken: HTTP 500 Internal Server Error"


@pytest.mark.parametrize(
    ("url", "form", "real"),
    [
        ("https://hooks.example.com/x?token=1", "webhook", "https://hooks.example.com/x?token=1"),
        ("ntfys://ntfy.example.com/a9", "ntfy", "https://ntfy.example.com/a9"),
        ("https://ntfy.sh/a9-queue", "ntfy", "https://ntfy.sh/a9-queue"),
    ],
)
def test_targets_by_their_form(url: str, form: str, real: str) -> None:
    assert (target(url).form, target(url).url) == (form, real)


def test_a_url_nothing_here_can_send_to_is_refused_before_the_runner_starts(tmp_path: Path) -> None:
    with pytest.raises(BadTarget, match="want an http"):
        target("mailto://me@example.com")
    import subprocess
    import sys

    from tests.conftest import REPO

    run = subprocess.run(
        [sys.executable, "-S", "-m", "runner", "run", "--root", str(tmp_path / "q"), "--notify", "slack://x"],
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(REPO)},
        timeout=30,
    )
    assert run.returncode == 2 and "want an http(s):// webhook URL" in run.stderr and "Traceback" not in run.stderr


def test_the_watcher_notifies_and_pings_too(
    tmp_path: Path, queue_root: Path, runner: RunnerProcess, receiver: tuple[str, Received]
) -> None:
    where, got = receiver
    assert importlib.util.find_spec("apprise") or not IN_CI, "CI installs plancompiler[notify]: apprise must be here"
    write_job(queue_root, "65-gate.job", "echo 'gate failed: boom-7'; exit 3\n")
    runner.start()
    wait_for(lambda: json.loads((queue_root / BOOK_FILE).read_text())["open"], 15)
    args = ["watch", str(queue_root), "--once", "--state", str(tmp_path / "w.json")]
    args += ["--notify", f"http://{where}/watch", "--ping", f"http://{where}/alive"]
    if importlib.util.find_spec("apprise"):  # the extra plancompiler[notify]: any apprise URL (CI installs it)
        args += ["--notify", f"json://{where}/apprise"]
    ran = plan_main(*args, cwd=tmp_path, cache=tmp_path / "c")
    assert ran.returncode == 10, ran.stderr  # delivered before the watcher exits
    [(_, body)] = got.on("/watch")
    sent = json.loads(body)
    assert sent["kind"] == "EVENT" and sent["message"].startswith(f"EVENT: {queue_root}: 65-gate.job failed: exited 3")
    assert got.on("/alive")[0][1].decode().startswith(f"{queue_root}: ")
    if importlib.util.find_spec("apprise"):
        [(_, body)] = got.on("/apprise")
        assert json.loads(body)["title"] == f"EVENT on {queue_root}"
    bad = plan_main("watch", str(queue_root), "--once", "--notify", "nosuch://x", cwd=tmp_path, cache=tmp_path / "c")
    assert bad.returncode == 2 and "--notify nosuch://x" in bad.stderr and "Traceback" not in bad.stderr
