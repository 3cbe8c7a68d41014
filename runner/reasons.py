"""Why each queued job is not running: requires, blocked (from manifest.json), gpu-foreign, and the rest."""
from __future__ import annotations

import os
from typing import Any

from runner import jobfile, leaks, procs
from runner.base import RunnerBase
from runner.records import Reason


class Reasons(RunnerBase):
    """Mixed into Runner: each queued job's one reason, and the facts behind it."""

    def _reason(self, now: float, filename: str, reason: str, detail: str, blocker: str = "", **extra: Any) -> None:
        current = self.reasons.get(filename)
        if current and current.reason == reason and current.blocker == blocker:
            current.detail = detail
            current.extra = extra
            return
        since = now
        if reason == "requires":
            since = self.state["waiting_since"].get(filename, now)
        self.reasons[filename] = Reason(reason, since, detail, blocker, extra)

    def _gpu_users(self) -> list[procs.GpuUser]:
        users, unreadable = procs.gpu_users(self.config.gpu_names, self.config.gpu_devices, self._is_ours)
        self.gpu_unknown = []
        for pid in unreadable:
            proc = procs.read_proc(pid)
            if proc is not None:
                self.gpu_unknown.append(procs.GpuUser(pid, proc.ppid, proc.cmdline,
                                                      "unknown: its open files cannot be read by this runner"))
        if self.config.unreadable_gpu == "block":
            users = users + self.gpu_unknown
        return users

    def _is_ours(self, proc: procs.Proc) -> bool:
        if proc.tag and proc.tag.startswith(self.root_id + ":"):
            return True
        return any(run.cgroup and proc.pid in procs.cgroup_pids(run.cgroup) for run in self.running.values())

    def _gpu_wait(self, now: float, filename: str, users: list[procs.GpuUser]) -> None:
        first = users[0]
        left_by = self.kept_leaks.get(first.pid)  # ours after all: escaped a job, which we can name
        if left_by is None and first.ppid == os.getpid():
            left_by = leaks.owner(self.lifetimes, leaks.start_ticks(first.pid))
        origin = f", left by job {left_by}" if left_by else ""
        self._reason(now, filename, "gpu-foreign", f"pid {first.pid} ({first.why}{origin}): {first.cmd[:120]}",
                     f"pid {first.pid}", pid=first.pid, cmd=first.cmd[:200], left_by=left_by)
        key = ("gpu-wait", f"{filename}:{first.pid}")
        last = self.announced.get(key)
        if last is None or now - last >= self.config.gpu_wait_repeat_s:
            self.announced[key] = now
            waited = now - self.reasons[filename].since
            self.queue.emit(now, filename, "gpu-wait", pid=first.pid, ppid=str(first.ppid), cmd=first.cmd[:200],
                            why=first.why, waited_s=int(waited), others=len(users) - 1,
                            **({"left_by": left_by} if left_by else {}))

    def _requires_false(self, now: float, filename: str, job: jobfile.JobFile, why: str) -> None:
        since = self.state["waiting_since"].setdefault(filename, now)
        blocked = self._blocked(filename)
        if blocked:
            path, producer, failure = blocked
            self._reason(now, filename, "blocked", failure, producer or path, path=path, producer=producer)
            self.reasons[filename].since = min(self.reasons[filename].since, now)
            return
        self._reason(now, filename, "requires", job.requires or "", job.requires or "", why=why)
        self.reasons[filename].since = since

    def _blocked(self, filename: str) -> tuple[str, str, str] | None:
        """(path, producer, why) when the manifest shows a REQUIRES path can never appear."""
        manifest = self._manifest()
        if not manifest:
            return None
        entry = manifest.get("jobs", {}).get(filename)
        if not entry:
            return None
        external = set(manifest.get("external", []))
        failed, present = self._presence()
        for path in entry.get("requires", []):
            full = os.path.join(self.root, path)
            if os.path.exists(full) or path in external:
                continue
            producers = manifest.get("producers", {}).get(path, [])
            if not producers:
                return path, "", f"no job produces {path}"
            if any(p in present for p in producers):
                continue
            producer = producers[0]
            if producer in failed:
                failure = self.state["last_failure"].get(producer, {})
                summary = failure.get("summary", "failed")
                return path, producer, f"{path} is produced by {producer}, which failed: {summary}"
            return path, producer, f"{path} is produced by {producer}, which is not on this host"
        return None

    def _manifest(self) -> dict[str, Any] | None:
        if self._manifest_tick == self.ticks:
            return self._manifest_cache[1] if self._manifest_cache else None
        self._manifest_tick = self.ticks
        try:
            st = os.stat(self.queue.manifest_path)
        except OSError:
            self._manifest_cache = None
            return None
        key = (st.st_mtime_ns, st.st_size, st.st_ino)
        if self._manifest_cache is None or self._manifest_cache[0] != key:
            manifest, problems = self.queue.read_manifest()
            self._manifest_cache = (key, manifest)
            self._report_corrupt(self.clock, "manifest.json", problems)
        return self._manifest_cache[1]

    def _presence(self) -> tuple[set[str], set[str]]:
        """(failed, queued-running-or-done) job files, listed once per tick."""
        if self._presence_tick != self.ticks:
            self._presence_tick = self.ticks
            self._presence_sets = (
                set(self.queue.list_all("failed")),
                set(self.queue.list_all("queue")) | set(self.queue.list_all("running"))
                | set(self.queue.list_all("done")),
            )
        return self._presence_sets
