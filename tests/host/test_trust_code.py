"""Verified code only: a runner package cached on the box (the zip, its unpacked copy, a `plan bootstrap` copy)
is imported only when it hashes to what this workstation ships; a tampered copy is ignored and replaced."""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from plancompiler.hosts import resolve
from plancompiler.transport import LOADER, runner_tree, runner_zip
from tests.conftest import plan_cli
from tests.sshd import Sshd

EVIL = "\nopen({proof!r}, 'w').write('ran')\n"


def _evil_zip(proof: Path) -> bytes:
    """The real package with a line added to runner/agent/dispatch.py that leaves PROOF behind."""
    _, data = runner_zip()
    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(data)) as src, zipfile.ZipFile(out, "w") as dst:
        for info in src.infolist():
            body = src.read(info)
            if info.filename == "runner/agent/dispatch.py":
                body += EVIL.format(proof=str(proof)).encode()
            dst.writestr(info, body)
    return out.getvalue()


@pytest.fixture
def box(tmp_path: Path, sshd: Sshd):
    root = tmp_path / "box"
    root.mkdir(mode=0o700)
    digest, _ = runner_zip()
    (sshd.directory / "cache" / "plan-runner" / f"runner-{digest}.pyz").unlink(missing_ok=True)
    shutil.rmtree(sshd.directory / "cache" / "plan-runner" / f"runner-{digest}.d", ignore_errors=True)
    return root, resolve("testbox", sshd.hosts_file(root))


def test_a_planted_zip_under_the_hash_is_never_imported(box, tmp_path: Path) -> None:
    root, host = box
    digest, data = runner_zip()
    proof = tmp_path / "proof"
    lib = root / ".plan-runner"
    lib.mkdir(mode=0o700)
    (lib / f"runner-{digest}.pyz").write_bytes(_evil_zip(proof))
    assert "error" not in host.call("status", {"offset": -1})
    assert not proof.exists(), "the planted package ran"
    assert (lib / f"runner-{digest}.pyz").read_bytes() == data, "replaced by an upload of the real one"


def test_an_edited_unpacked_copy_is_never_imported(box, tmp_path: Path) -> None:
    root, host = box
    digest, _ = runner_zip()
    proof = tmp_path / "proof"
    assert "error" not in host.call("status", {"offset": -1})  # stored and unpacked
    agent = root / ".plan-runner" / f"runner-{digest}.d" / "runner" / "agent" / "dispatch.py"
    real = agent.read_text()
    agent.write_text(real + EVIL.format(proof=str(proof)))
    extra = agent.parent / "sitecustomize.py"
    assert "error" not in host.call("status", {"offset": -1})
    assert not proof.exists(), "the edited copy ran"
    assert agent.read_text() == real and not extra.exists(), "unpacked again from the checked zip"
    # A file added to the copy changes its hash too.
    extra.write_text(EVIL.format(proof=str(proof)))
    assert "error" not in host.call("status", {"offset": -1})
    assert not extra.exists()


def test_an_edited_bootstrap_copy_is_never_imported(box, tmp_path: Path, sshd: Sshd) -> None:
    root, host = box
    digest, _ = runner_zip()
    proof = tmp_path / "proof"
    code, out = plan_cli("bootstrap", "testbox", "--hosts", str(sshd.hosts_file(root)), "--user")
    assert code == 0, out
    lib = root / ".plan-runner"
    for cached in lib.glob("runner-*"):
        shutil.rmtree(cached) if cached.is_dir() else cached.unlink()
    assert (lib / "runner.hash").read_text().strip() == digest
    agent = lib / "runner" / "agent" / "dispatch.py"
    agent.write_text(agent.read_text() + EVIL.format(proof=str(proof)))
    assert "error" not in host.call("status", {"offset": -1})
    assert not proof.exists(), "the edited bootstrap copy ran"
    assert (lib / f"runner-{digest}.pyz").exists(), "the workstation uploaded its own instead"


def test_the_tree_hash_is_of_the_package_the_zip_holds() -> None:
    """The loader's TREE, computed here from the sources, is what the unpacked zip hashes to there."""
    import hashlib

    _, data = runner_zip()
    digest = hashlib.sha256()
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        for name in sorted(n for n in archive.namelist() if n.startswith("runner/") and n.endswith(".py")):
            digest.update(name.encode() + b"\0" + archive.read(name) + b"\0")
    assert digest.hexdigest()[:32] == runner_tree()


def _loader(root: Path, cache: Path, mode: str, stdin: bytes) -> subprocess.Popen:
    """The real loader, run here as a box runs it (the workstation's LOADER, this machine's python3)."""
    digest, _ = runner_zip()
    env = {**os.environ, "XDG_CACHE_HOME": str(cache)}
    env.pop("PYTHONPATH", None)  # the box has no runner of its own: only what the loader finds and checks
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    proc = subprocess.Popen(
        [sys.executable, "-S", "-c", LOADER, digest, runner_tree(), mode, str(root)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd="/",
        env=env,
    )
    proc.stdin.write(stdin)  # type: ignore[union-attr]
    proc.stdin.close()  # type: ignore[union-attr]
    return proc


def _all_answer(loads: list[subprocess.Popen]) -> None:
    ends = [(p.wait(120), p.stdout.read(), p.stderr.read()) for p in loads]  # type: ignore[union-attr]
    failed = [(rc, err.decode()[-300:]) for rc, out, err in ends if rc != 0 or b'"error"' in out]
    assert not failed, failed


CHURN = """
import os, sys
n = 0
while True:
    n += 1
    names = [os.path.join(sys.argv[1], "vocab.cpython-3x.pyc.%d.%d" % (n, k)) for k in range(40)]
    for name in names:
        open(name, "wb").close()
    for name in names:
        os.unlink(name)
"""


def test_simultaneous_loads_never_disturb_each_other(tmp_path: Path) -> None:
    """Many agents load the unpacked copy at once while bytecode comes and goes in it (Python writes each .pyc
    as a temporary file, then renames it): every one of them imports the package and answers. A file that
    vanished while one of them checked the copy never made it unpack again under another's imports."""
    root, cache = tmp_path / "box", tmp_path / "cache"
    root.mkdir(mode=0o700)
    cache.mkdir(mode=0o700)
    digest, data = runner_zip()
    upload = _loader(root, cache, "--upload", data)
    assert upload.wait(60) == 0, upload.stderr.read()  # type: ignore[union-attr]
    # The first loads find no unpacked copy: one of them unpacks it, and no other sets that copy aside.
    _all_answer([_loader(root, cache, "status", b'{"offset": -1}') for _ in range(16)])
    unpacked = root / ".plan-runner" / f"runner-{digest}.d"
    inode = unpacked.stat().st_ino
    # What loads compiling the package do to the copy (Python writes each .pyc as a temporary file, then
    # renames it), as often as this machine allows, from a process of its own.
    churn = subprocess.Popen([sys.executable, "-c", CHURN, str(unpacked / "runner" / "__pycache__")])
    try:
        _all_answer([_loader(root, cache, "status", b'{"offset": -1}') for _ in range(16)])
    finally:
        churn.kill()
        churn.wait()
    assert unpacked.stat().st_ino == inode, "unpacked again"
    assert (unpacked / "runner" / "vocab.py").is_file()
    assert not list((root / ".plan-runner").glob(".runner-*")), "no unpacking left behind"
