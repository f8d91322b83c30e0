"""Shared helpers of the fault suite: start a job of fault_rank processes on
loopback with the launcher variables, and collect what each rank printed."""

import os
import signal
import socket
import subprocess
import time


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def monotonic_ms():
    return time.clock_gettime(time.CLOCK_MONOTONIC) * 1000.0


class Job:
    """`nranks` processes of `argv`, ranks 0..n-1, rendezvous on loopback."""

    def __init__(self, argv, nranks, extra_env=None, timeout_s=30):
        self.port = free_port()
        self.timeout_s = timeout_s
        self.procs = []
        for rank in range(nranks):
            env = dict(os.environ)
            env.update({
                "RANK": str(rank),
                "WORLD_SIZE": str(nranks),
                "MASTER_ADDR": "127.0.0.1",
                "SQUALL_PORT": str(self.port),
                "SQUALL_SOCKET_IFNAME": "lo",
                "SQUALL_JOB_SECRET": "fault-suite-%d" % self.port,
                "SQUALL_TIMEOUT_S": str(max(5, timeout_s // 2)),
                "UCX_NET_DEVICES": "lo",
            })
            env.update(extra_env or {})
            self.procs.append(subprocess.Popen(
                argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))

    def kill(self, rank):
        self.procs[rank].send_signal(signal.SIGKILL)

    def wait(self):
        """[(returncode, stdout, stderr)] per rank; a hung rank is killed (rc None)."""
        deadline = time.monotonic() + self.timeout_s
        results = []
        for p in self.procs:
            left = max(0.1, deadline - time.monotonic())
            try:
                out, err = p.communicate(timeout=left)
                results.append((p.returncode, out, err))
            except subprocess.TimeoutExpired:
                p.kill()
                out, err = p.communicate()
                results.append((None, out, err))
        return results


def bind_failed(results):
    """True when a rank could not take the port (another program grabbed it
    between free_port() and the bind): the run says nothing about us."""
    return any("cannot listen" in (err or "") or "cannot listen" in (out or "")
               for _, out, err in results)


def fail_line(out):
    for line in (out or "").splitlines():
        if line.startswith("FAIL "):
            return line
    return None
