"""Shared helpers of the fault suite: start a job of fault_rank processes on
loopback with the launcher variables, and collect what each rank printed."""

import os
import signal
import socket
import subprocess
import tempfile
import time


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def monotonic_ms():
    return time.clock_gettime(time.CLOCK_MONOTONIC) * 1000.0


class Job:
    """`nranks` processes of `argv`, ranks 0..n-1, rendezvous on loopback.
    `ranks`: the ranks to start now (the others with start()); `preexec`:
    rank -> function run in that child before exec (e.g. a descriptor limit)."""

    def __init__(self, argv, nranks, extra_env=None, timeout_s=30, preexec=None, ranks=None):
        self.port = free_port()
        self.argv = argv
        self.nranks = nranks
        self.timeout_s = timeout_s
        self.extra_env = extra_env or {}
        self.preexec = preexec or {}
        self.procs = [None] * nranks
        self.files = [None] * nranks
        for rank in range(nranks) if ranks is None else ranks:
            self.start(rank)

    def start(self, rank):
        env = dict(os.environ)
        env.update({
            "RANK": str(rank),
            "WORLD_SIZE": str(self.nranks),
            "MASTER_ADDR": "127.0.0.1",
            "SQUALL_PORT": str(self.port),
            "SQUALL_SOCKET_IFNAME": "lo",
            "SQUALL_JOB_SECRET": "fault-suite-%d" % self.port,
            "SQUALL_TIMEOUT_S": str(max(5, self.timeout_s // 2)),
            "UCX_NET_DEVICES": "lo",
        })
        env.update(self.extra_env)
        out = tempfile.TemporaryFile(mode="w+")
        err = tempfile.TemporaryFile(mode="w+")
        self.files[rank] = (out, err)
        self.procs[rank] = subprocess.Popen(self.argv, env=env, stdout=out, stderr=err,
                                            preexec_fn=self.preexec.get(rank))

    def output(self, rank):
        out, _ = self.files[rank]
        out.seek(0)
        return out.read()

    def wait_ready(self, timeout_s=20):
        """True once every rank printed READY (init done); False when a rank
        exited without printing it. A rank that printed READY and already
        finished its job counts as ready: fast ranks can be done before the
        slowest one's READY is seen."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if all(p is not None and "READY" in self.output(r) for r, p in enumerate(self.procs)):
                return True
            # poll() before reading: an exited rank's output is complete.
            if any(p is not None and p.poll() is not None and "READY" not in self.output(r)
                   for r, p in enumerate(self.procs)):
                return False
            time.sleep(0.005)
        return False

    def kill(self, rank):
        self.procs[rank].send_signal(signal.SIGKILL)

    def wait(self):
        """[(returncode, stdout, stderr)] per rank; a hung rank is killed (rc None)."""
        deadline = time.monotonic() + self.timeout_s
        results = []
        for rank, p in enumerate(self.procs):
            rc = None
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
                rc = p.returncode
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
            out, err = self.files[rank]
            out.seek(0)
            err.seek(0)
            results.append((rc, out.read(), err.read()))
            out.close()
            err.close()
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
