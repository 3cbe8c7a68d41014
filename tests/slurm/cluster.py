"""A single-node Slurm cluster on 127.0.0.1 (munged, slurmctld, slurmd) with a fake GPU and licenses."""

from __future__ import annotations

import functools
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.ports import free_ports
from tests.sshd import IN_CI


@dataclass
class Slurm:
    directory: Path
    conf: Path
    pids: dict[str, int]

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def hosts_file(self, root: Path, name: str = "cluster", extra: str = "") -> Path:
        """A hosts file naming this cluster NAME with ROOT; EXTRA is more YAML for the host (4-space indented)."""
        path = root.parent / f"hosts-{name}.yaml"
        path.write_text(
            f"hosts:\n  {name}:\n    backend: slurm\n    root: '{root}'\n    slurm_conf: {self.conf}\n" + extra
        )
        return path

    def squeue(self, expand: bool = False) -> list[dict[str, str]]:
        """Every job slurmctld holds; EXPAND: an array's pending elements one by one (squeue -r)."""
        out = subprocess.run(
            ["squeue", "-h", "-a", "-t", "all", *(["-r"] if expand else []), "-o", "%i|%j|%T|%r|%k|%E"],
            capture_output=True,
            text=True,
            env=self.env,
            check=True,
        ).stdout
        keys = ["id", "name", "state", "reason", "comment", "dependency"]
        return [dict(zip(keys, line.split("|"), strict=True)) for line in out.splitlines()]


def _listening(port: int, timeout: float = 30) -> None:
    """Wait until something accepts connections on 127.0.0.1:PORT. A Slurm client that finds a daemon not yet
    listening tries again a second later; this looks every 20 ms."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise RuntimeError(f"nothing listens on port {port}") from None
            time.sleep(0.02)


def _pid(path: Path, timeout: float = 10) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            return int(path.read_text().strip())
        except (OSError, ValueError):
            time.sleep(0.05)
    raise RuntimeError(f"no pid file {path}")


# A throwaway database's InnoDB files at their smallest: by default its redo log (96 MB), system tablespace (grown
# by 64 MB at a time) and temporary tablespace made ~190 MB on disk for each cluster with accounting; 36 MB so, and
# it answers a second or two sooner.
_SMALL_DB = [
    "--innodb-log-file-size=8M",
    "--innodb-data-file-path=ibdata1:8M:autoextend",
    "--innodb-autoextend-increment=4",
    "--innodb-temp-data-file-path=ibtmp1:4M:autoextend",
]


def _start_mariadb(d: Path, pids: dict[str, int]) -> int:
    """A private mariadbd on 127.0.0.1 (its data, socket, log and temporary files under D) with a user `slurm`;
    its port. Two bootstraps sharing /tmp for their temporary tables collide now and then (a cluster per
    worker, two clusters at once in the sacct test): each gets its own."""
    data, tmp = d / "db", d / "db-tmp"
    tmp.mkdir()
    subprocess.run(
        [
            "mariadb-install-db",
            "--no-defaults",
            f"--datadir={data}",
            f"--tmpdir={tmp}",
            "--user=root",
            "--auth-root-authentication-method=normal",
            "--skip-test-db",
            *_SMALL_DB,
        ],
        check=True,
        capture_output=True,
    )
    (port,) = free_ports(1)
    sock = d / "db.sock"
    subprocess.Popen(
        [
            "mariadbd",
            "--no-defaults",
            f"--datadir={data}",
            f"--tmpdir={tmp}",
            f"--socket={sock}",
            f"--pid-file={d}/db.pid",
            f"--port={port}",
            "--bind-address=127.0.0.1",
            "--user=root",
            f"--log-error={d}/db.err",
            "--skip-log-bin",
            "--innodb-buffer-pool-size=16M",
            *_SMALL_DB,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    pids["mariadbd"] = _pid(d / "db.pid", 30)
    deadline = time.monotonic() + 30
    while True:
        made = subprocess.run(
            [
                "mariadb",
                "--no-defaults",
                f"--socket={sock}",
                "-uroot",
                "-e",
                "CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY 'plantest'; "
                "GRANT ALL ON *.* TO 'slurm'@'127.0.0.1'",
            ],
            capture_output=True,
            text=True,
        )
        if made.returncode == 0:
            return port
        if time.monotonic() > deadline:
            raise RuntimeError(f"mariadb did not start: {made.stderr}")
        time.sleep(0.2)


def _start_slurmdbd(d: Path, sock: Path, db_port: int, port: int, env: dict[str, str], pids: dict[str, int]) -> None:
    """slurmdbd on PORT over that database; it reads slurmdbd.conf from the directory of $SLURM_CONF."""
    conf = d / "slurmdbd.conf"
    conf.write_text(f"""AuthType=auth/munge
AuthInfo=socket={sock}
DbdHost=localhost
DbdAddr=127.0.0.1
DbdPort={port}
SlurmUser=root
PidFile={d}/slurmdbd.pid
LogFile={d}/slurmdbd.log
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort={db_port}
StorageUser=slurm
StoragePass=plantest
StorageLoc=slurm_acct_db
""")
    conf.chmod(0o600)  # slurmdbd refuses a config others can read: it holds the database password
    subprocess.run(["slurmdbd"], check=True, env=env)
    pids["slurmdbd"] = _pid(d / "slurmdbd.pid", 30)
    _listening(port)
    deadline = time.monotonic() + 60
    while True:
        added = subprocess.run(
            ["sacctmgr", "-i", "add", "cluster", "plantest"], capture_output=True, text=True, env=env
        )
        if added.returncode == 0 or "already exists" in added.stdout + added.stderr:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"slurmdbd did not answer: {added.stdout} {added.stderr}")
        time.sleep(0.3)


def start_slurm(
    d: Path,
    min_job_age: int = 3600,
    accounting: bool = False,
    job_comment: bool = False,
    message_timeout: int = 10,
    settings: dict[str, int] | None = None,
    memory: bool = False,
) -> Slurm:
    """A cluster in D; MIN_JOB_AGE low makes slurmctld forget finished jobs soon (within about 10 s at 2).
    ACCOUNTING adds slurmdbd over a private mariadb (sacct answers); JOB_COMMENT stores job comments there.
    MESSAGE_TIMEOUT is how long a client (squeue, sbatch) waits for a controller that does not answer.
    MEMORY: memory is a consumable (CR_Core_Memory) and each job's limit is its cgroup's (task/cgroup,
    ConstrainRAMSpace): a job over it ends OUT_OF_MEMORY (skipped where no cgroup v1 memory controller is
    writable).
    SETTINGS: more slurm.conf lines (MaxArraySize, MaxJobCount, JobRequeue...), and the user's MaxSubmitJobs
    (which needs ACCOUNTING: it is set with sacctmgr, enforced by AccountingStorageEnforce=limits).
    Starting one takes a fraction of a second (a few seconds with accounting), so tests may start their own."""
    settings = dict(settings or {})
    max_submit = settings.pop("MaxSubmitJobs", None)
    assert max_submit is None or accounting, "MaxSubmitJobs is an accounting limit"
    tools = ["munged", "mungekey", "slurmctld", "slurmd", "sbatch", "squeue", "scancel"]
    if any(shutil.which(t) is None and not os.path.exists(f"/usr/sbin/{t}") for t in tools):
        if IN_CI:
            pytest.fail("Slurm or munge missing in CI: .ci/run must install slurmctld slurmd slurm-client munge")
        pytest.skip("slurmctld/slurmd/munge not installed")
    for sub in ("state", "spool", "dev"):
        (d / sub).mkdir(parents=True, exist_ok=True)
    # munged wants every directory above its socket searchable by all; pytest's tmp dirs are 0700.
    munge = Path(tempfile.mkdtemp(prefix="plan-munge-"))
    os.chmod(munge, 0o755)
    (d / "munge").symlink_to(munge)
    subprocess.run(["mknod", "-m", "666", str(d / "dev/gpu0"), "c", "1", "3"], check=True)
    subprocess.run(["mungekey", "--create", f"--keyfile={d / 'munge/munge.key'}"], check=True, capture_output=True)
    sock = munge / "sock"
    subprocess.run(
        [
            "munged",
            f"--key-file={d / 'munge/munge.key'}",
            f"--socket={sock}",
            f"--pid-file={d / 'munge/pid'}",
            f"--log-file={d / 'munge/log'}",
            f"--seed-file={d / 'munge/seed'}",
        ],
        check=True,
    )
    pids = {"munged": _pid(d / "munge/pid")}
    ctld_port, slurmd_port = free_ports(2)
    conf = d / "slurm.conf"
    env = {**os.environ, "SLURM_CONF": str(conf)}
    storage = "AccountingStorageType=accounting_storage/none"
    if accounting:
        if shutil.which("slurmdbd") is None and not os.path.exists("/usr/sbin/slurmdbd"):
            if IN_CI:
                pytest.fail("slurmdbd missing in CI: .ci/run must install slurmdbd mariadb-server")
            pytest.skip("slurmdbd/mariadb-server not installed")
        (dbd_port,) = free_ports(1)
        # The password slurmctld gives slurmdbd is the munge socket to authenticate through.
        storage = (
            f"AccountingStorageType=accounting_storage/slurmdbd\nAccountingStorageHost=localhost\n"
            f"AccountingStoragePort={dbd_port}\nAccountingStoragePass={sock}\n"
            "JobAcctGatherType=jobacct_gather/none"
        )
        if job_comment:
            storage += "\nAccountingStoreFlags=job_comment"
        if max_submit is not None:
            storage += "\nAccountingStorageEnforce=associations,limits"
    conf_limits = "".join(f"{key}={value}\n" for key, value in settings.items())
    task, select = "task/none", "CR_Core"
    if memory and not memory_cgroup_usable():
        if IN_CI:
            pytest.fail("CI's machines mount a writable cgroup v1 memory controller: the memory-limit tests must run")
        pytest.skip("no writable cgroup v1 memory controller at /sys/fs/cgroup/memory for Slurm's task/cgroup")
    if memory:
        task, select = "task/cgroup", "CR_Core_Memory"
        (d / "cgroup.conf").write_text(
            "CgroupPlugin=cgroup/v1\nCgroupMountpoint=/sys/fs/cgroup\nConstrainRAMSpace=yes\nConstrainSwapSpace=yes\n"
            "AllowedSwapSpace=0\nIgnoreSystemd=yes\n"
        )
    conf.write_text(f"""ClusterName=plantest
SlurmctldHost=localhost
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
AuthType=auth/munge
AuthInfo=socket={sock}
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd.pid
SlurmctldLogFile={d}/slurmctld.log
SlurmdLogFile={d}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin={task}
SelectType=select/cons_tres
SelectTypeParameters={select}
# Latency over throughput: pending jobs are looked at every second, not after up to a minute (the tests wait
# on every start).
SchedulerParameters=batch_sched_delay=0,sched_interval=1,bf_interval=1,sched_min_interval=0
# An epilog, if only /bin/true: slurmd then reports each job's end with an epilog-complete message, on which
# slurmctld schedules at once; without one, a job's dependents and the jobs waiting for its GRES or licenses
# start at the next pass, up to a second later.
Epilog=/bin/true
MessageTimeout={message_timeout}
# The login environment of an --export=NONE job from StateSaveLocation/env_cache (_cache_login_env), not `su -`
GetEnvTimeout=0
ReturnToService=2
MailProg=/bin/true
GresTypes=gpu
Licenses=net:1,netgpu:1
MinJobAge={min_job_age}
{conf_limits}{storage}
JobCompType=jobcomp/none
# More CPUs than the machine has (config_overrides: slurmd reports these, not the hardware's): the test jobs
# mostly wait, and only their lanes' GRES and licenses, never a CPU count, should make them take turns.
SlurmdParameters=config_overrides
NodeName=localhost NodeAddr=127.0.0.1 CPUs=8 RealMemory=1000 Gres=gpu:1 State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP
""")
    (d / "gres.conf").write_text(f"NodeName=localhost Name=gpu File={d}/dev/gpu0\n")
    _cache_login_env(d / "state")
    if accounting:
        _start_slurmdbd(d, sock, _start_mariadb(d, pids), dbd_port, env, pids)
        if max_submit is not None:  # on every association of this user (the cluster made one, account root)
            user = pwd.getpwuid(os.getuid()).pw_name
            subprocess.run(
                ["sacctmgr", "-i", "modify", "user", "where", f"name={user}", "set", f"MaxSubmitJobs={max_submit}"],
                check=True,
                env=env,
                capture_output=True,
            )
    subprocess.run(["slurmctld", "-c", "-f", str(conf)], check=True, env=env)
    pids["slurmctld"] = _pid(d / "slurmctld.pid")
    _listening(ctld_port)
    subprocess.run(["slurmd", "-N", "localhost", "-f", str(conf)], check=True, env=env)
    pids["slurmd"] = _pid(d / "slurmd.pid")
    cluster = Slurm(d, conf, pids)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        out = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True, env=env).stdout
        if out.strip() == "idle":
            return cluster
        time.sleep(0.2)
    stop_slurm(cluster)
    pytest.fail(f"the Slurm node did not become idle: {out!r}")


def memory_cgroup_usable() -> bool:
    """Whether Slurm's task/cgroup (cgroup/v1) can make a job's memory cgroup here: the memory controller is
    mounted at /sys/fs/cgroup/memory and a cgroup can be made in it."""
    probe = Path("/sys/fs/cgroup/memory") / f"plantest-{os.getpid()}"
    try:
        probe.mkdir()
        probe.rmdir()
    except OSError:
        return False
    return True


def _cache_login_env(state: Path) -> None:
    """The submitting user's login environment, as slurmd reads it for an `sbatch --export=NONE` job when
    GetEnvTimeout=0 (STATE/env_cache/USER). Asked per job instead, slurmd runs `su - USER -c env` and, racing
    its exit, sleeps a second: 1-2 s before every job starts."""
    user = pwd.getpwuid(os.getuid()).pw_name
    (state / "env_cache").mkdir(exist_ok=True)
    # as a ~/.bash_profile export would show there: a job must never get it (tests/slurm/test_slurm_conventions.py)
    (state / "env_cache" / user).write_text(_login_env(user) + "PLAN_LOGIN_PROFILE=loaded\n")


@functools.cache
def _login_env(user: str) -> str:
    """USER's login environment, read once a process: this machine's login profile (pyenv init and its rehash)
    took 0.4 s and ~150 processes for each cluster a worker started."""
    return subprocess.run(
        ["su", "-", user, "-c", "/usr/bin/env"],
        env={"ENVIRONMENT": "BATCH"},  # what slurmd gives `su`, and nothing of this test process
        capture_output=True,
        text=True,
        check=True,
    ).stdout


def stop_slurm(cluster: Slurm) -> None:
    # Its jobs are cancelled, and given a moment to end on TERM; then whatever still runs of them (a job that
    # ignores TERM would hold on for Slurm's KillWait, 30 s) and the daemons are killed outright.
    subprocess.run(["scancel", "-u", "root"], env=cluster.env, capture_output=True)
    deadline = time.monotonic() + 2
    while time.monotonic() < deadline:
        out = subprocess.run(
            ["squeue", "-h", "-t", "running,completing,pending", "-o", "%i"],
            env=cluster.env,
            capture_output=True,
            text=True,
        ).stdout
        if not out.strip():
            break
        time.sleep(0.1)
    jobs = _job_processes(cluster)
    # The cluster's state, spool and database are thrown away: its daemons (by the pids they wrote) and every
    # process of its jobs are killed outright; asked to stop, each daemon took 1-2 s to save what is thrown away.
    for pid in [cluster.pids[name] for name in _DAEMONS if name in cluster.pids] + jobs:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    for pid in cluster.pids.values():
        _reap(pid)
    shutil.rmtree((cluster.directory / "munge").resolve(), ignore_errors=True)


_DAEMONS = ("slurmd", "slurmctld", "slurmdbd", "mariadbd", "munged")


def _reap(pid: int, timeout: float = 10) -> None:
    """Wait until PID is gone. mariadbd is our child (the rest daemonize): reap it, or it stays a zombie."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if os.waitpid(pid, os.WNOHANG)[0] == pid:
                return
        except ChildProcessError:
            pass
        try:
            with open(f"/proc/{pid}/stat") as handle:
                if handle.read().rsplit(")", 1)[1].split()[0] in ("Z", "X"):
                    return  # another's zombie: dead, its parent reaps it
        except OSError:
            return
        time.sleep(0.02)


def _job_processes(cluster: Slurm) -> list[int]:
    """This cluster's step daemons and its jobs' processes: all carry its SLURM_CONF in their environment."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            env = Path(f"/proc/{entry}/environ").read_bytes()
        except OSError:
            continue
        if f"\0SLURM_CONF={cluster.conf}\0".encode() in b"\0" + env + b"\0" and int(entry) != os.getpid():
            found.append(int(entry))
    return found


@pytest.fixture(scope="session")
def slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Slurm]:
    cluster = start_slurm(tmp_path_factory.mktemp("slurm"))
    yield cluster
    stop_slurm(cluster)
