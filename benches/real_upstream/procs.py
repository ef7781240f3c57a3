"""Child processes of the real-upstream bench: the replicas and the fronts.

Every child runs in a process group of its own and is recorded here, so that whatever way the
driver ends (normal exit, an exception, Ctrl-C, SIGTERM) every group is terminated, then killed.
Only loopback addresses are used.
"""

from __future__ import annotations

import atexit
import os
import re
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

_CHILDREN: list[subprocess.Popen] = []


def free_port() -> int:
    """A port that is free on 127.0.0.1 right now (the child binds it a moment later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Child:
    """One child process (and its process group), its log file and what it serves."""

    def __init__(self, name: str, argv: list[str], log_dir: Path, env: dict | None = None):
        self.name = name
        self.argv = argv
        self.log_path = log_dir / f"{name}.log"
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, **(env or {})},
        )
        _CHILDREN.append(self.proc)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def tail(self, n: int = 6) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        text = re.sub(r"\x1b\[[0-9;]*m", "", text)
        return "\n".join(line[:300] for line in text.splitlines()[-n:])

    def stop(self, grace: float = 5.0) -> None:
        _stop(self.proc, grace)
        if self.proc in _CHILDREN:
            _CHILDREN.remove(self.proc)
        self._log.close()


def _stop(proc: subprocess.Popen, grace: float) -> None:
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(timeout=5)


def kill_all() -> None:
    """Ends every child still running (their whole process groups)."""
    while _CHILDREN:
        proc = _CHILDREN.pop()
        try:
            _stop(proc, 3.0)
        except Exception:  # noqa: BLE001 - best effort on the way out
            pass


def _on_signal(signum, _frame):
    kill_all()
    # Re-raise as the conventional exit so callers' `finally` blocks still run.
    raise SystemExit(128 + signum)


def install_cleanup() -> None:
    atexit.register(kill_all)
    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGHUP, _on_signal)
    # SIGINT stays KeyboardInterrupt: it unwinds through `finally` and then atexit.


def wait_http(child: Child, url: str, timeout: float, ok=lambda status, body: status == 200) -> None:
    """Polls `url` until it answers as `ok` says; raises with the child's log tail otherwise."""
    deadline = time.monotonic() + timeout
    last = "no answer"
    while time.monotonic() < deadline:
        if not child.alive():
            raise RuntimeError(
                f"{child.name} exited with {child.proc.returncode} before it was ready; "
                f"log {child.log_path}:\n{child.tail()}"
            )
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                body = resp.read()
                if ok(resp.status, body):
                    return
                last = f"status {resp.status}"
        except urllib.error.HTTPError as e:
            last = f"status {e.code}"
        except (OSError, urllib.error.URLError) as e:
            last = str(e)
        time.sleep(0.2)
    raise RuntimeError(
        f"{child.name} not ready at {url} within {timeout:.0f} s ({last}); "
        f"log {child.log_path}:\n{child.tail()}"
    )


def http_get(url: str, timeout: float = 5.0) -> str | None:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.read().decode(errors="replace")
    except (OSError, urllib.error.URLError):
        return None


def loadavg() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None
