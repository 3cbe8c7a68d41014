"""A real sshd on 127.0.0.1 with its own config and keys, started and stopped by the test fixture."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.ports import free_ports

SSHD = "/usr/sbin/sshd"
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


@dataclass
class Sshd:
    proc: subprocess.Popen[bytes]
    port: int
    config: Path  # the client's ssh_config, with Host alias "testbox"
    directory: Path

    def hosts_file(self, root: Path, name: str = "testbox", at: Path | None = None, **extra: object) -> Path:
        """A hosts file naming NAME on this sshd (written AT, else in the sshd's directory)."""
        path = at or self.directory / f"hosts-{name}.yaml"
        lines = [
            f"hosts:\n  {name}:\n    ssh: testbox\n    root: {root}\n    python: {sys.executable}\n",
            f"    ssh_options: [-F, {self.config}]\n",
        ]
        lines += [f"    {k}: {v}\n" for k, v in extra.items()]
        path.write_text("".join(lines))
        return path

    def connection_pids(self) -> list[int]:
        """The per-connection sshd children (`sshd: root@notty`) of our listener."""
        out = subprocess.run(["pgrep", "-P", str(self.proc.pid)], capture_output=True, text=True).stdout
        return [int(p) for p in out.split()]


def start_sshd(directory: Path) -> Sshd:
    if not os.path.exists(SSHD) or shutil.which("ssh") is None:
        if IN_CI:
            pytest.fail("sshd/ssh missing in CI: .ci/run must install openssh-server")
        pytest.skip("openssh-server not installed")
    directory.mkdir(parents=True, exist_ok=True)
    for key in ("hostkey", "clientkey"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(directory / key)], check=True)
    (directory / "authorized_keys").write_text((directory / "clientkey.pub").read_text())
    (directory / "home").mkdir(exist_ok=True)
    (port,) = free_ports(1)
    sshd_config = directory / "sshd_config"
    sshd_config.write_text(
        f"Port {port}\nListenAddress 127.0.0.1\nHostKey {directory / 'hostkey'}\nPidFile {directory / 'sshd.pid'}\n"
        f"AuthorizedKeysFile {directory / 'authorized_keys'}\nUsePAM no\nPasswordAuthentication no\n"
        "KbdInteractiveAuthentication no\nStrictModes no\nPermitRootLogin prohibit-password\n"
        "MaxStartups 100\nLogLevel ERROR\n"
        # The host user's home and cache (where a runner package goes while its root does not exist) are the
        # test's own: bash over ssh reads ~/.bashrc, and this machine's user's (pyenv init) cost 0.14 s a call.
        f"SetEnv XDG_CACHE_HOME={directory / 'cache'} HOME={directory / 'home'}\n"
    )
    os.makedirs("/run/sshd", exist_ok=True)
    proc = subprocess.Popen([SSHD, "-D", "-f", str(sshd_config), "-E", str(directory / "sshd.log")])
    config = directory / "ssh_config"
    config.write_text(
        f"Host testbox\n  HostName 127.0.0.1\n  Port {port}\n  User {os.environ.get('USER') or 'root'}\n"
        f"  IdentityFile {directory / 'clientkey'}\n  IdentitiesOnly yes\n  StrictHostKeyChecking no\n"
        "  UserKnownHostsFile /dev/null\n  LogLevel ERROR\n  BatchMode yes\n"
        # The client's share of a connection: 0.10 s of CPU with the default post-quantum key exchange, 0.02 s so.
        "  KexAlgorithms curve25519-sha256\n"
    )
    server = Sshd(proc, port, config, directory)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if subprocess.run(["ssh", "-F", str(config), "testbox", "true"], capture_output=True).returncode == 0:
            return server
        if proc.poll() is not None:
            break
        time.sleep(0.1)
    stop_sshd(server)
    log = (directory / "sshd.log").read_text() if (directory / "sshd.log").exists() else ""
    pytest.fail(f"sshd did not answer on 127.0.0.1:{port}: {log}")


def stop_sshd(server: Sshd) -> None:
    for pid in server.connection_pids():
        try:
            os.kill(pid, signal.SIGCONT)
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    try:
        os.kill(server.proc.pid, signal.SIGCONT)
    except OSError:
        pass
    server.proc.terminate()
    try:
        server.proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        server.proc.kill()
        server.proc.wait()


@pytest.fixture(scope="session")
def sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sshd]:
    server = start_sshd(tmp_path_factory.mktemp("sshd"))
    yield server
    stop_sshd(server)
