"""The exit of a process whose DDP onebit hook is still completing a bucket.

The hook's completion thread (squall.ddp's daemon thread) runs torch calls
(the momentum update, copy_, set_result) that release the GIL and take it
back in a noexcept destructor. A script that ends right after its last
backward pass leaves the last bucket's completion in flight; if the
interpreter finalises meanwhile, that thread is ended (pthread_exit) when it
next takes the GIL, the unwinding meets the noexcept frame and the process
aborts: "terminate called without an active exception". squall.ddp stops
its completion threads at exit, before the interpreter finalises.

  hook_exit_loop.py RUNS [NUMEL] [JOBS]

Imports torch once, then forks RUNS children (JOBS at a time, default 2).
Each makes a one-rank communicator, starts one compressed bucket of NUMEL
elements through onebit_hook and returns as soon as the completion thread
is inside a torch call of that bucket (or the bucket is done), keeping the
GIL until the interpreter finalises: the worst case of the race, which a
real script hits now and then. Prints one JSON line (runs, aborts, other failures, the first
failure's stderr) and exits 1 when any child did not exit cleanly."""

import atexit
import gc
import json
import linecache
import os
import signal
import sys
import tempfile
import time
import warnings

_finalising = False


def _after_atexit():
    global _finalising
    _finalising = True


# Registered before squall is imported, so it runs after squall's own exit
# handlers (atexit runs them in reverse order): what follows it is the
# interpreter's finalisation proper.
atexit.register(_after_atexit)

import torch  # noqa: E402

import squall  # noqa: E402
import squall.ddp  # noqa: E402


def _leave_early(phase, info, _sleep=time.sleep, _exit=os._exit):
    """The collection the interpreter runs once finalising: a completion
    thread still alive gets 20 ms to take the GIL (and abort); then the
    child leaves, skipping the rest of the teardown (seconds with torch)."""
    if _finalising and phase == "start":
        _sleep(0.02)
        _exit(0)


class _Bucket:
    def __init__(self, tensor):
        self._t = tensor

    def buffer(self):
        return self._t

    def index(self):
        return 0

    def is_last(self):
        return True

    def parameters(self):
        return [self._t]


def _in_torch(thread):
    """Whether `thread` runs a line of the bucket's completion (the hook's
    closure `finish`) other than its wait for the allreduce: a torch call,
    which runs with the GIL released."""
    frame = sys._current_frames().get(thread.ident)
    if frame is None or frame.f_code.co_name != "finish":
        return False
    return "wait()" not in linecache.getline(frame.f_code.co_filename, frame.f_lineno)


_alive = []  # what a training script keeps to its end: the communicator, the hook's state


def child(numel):
    warnings.simplefilter("ignore")
    comm = squall.Communicator.from_unique_id(squall.get_unique_id(), 1, 0, transport="tcp")
    state = squall.ddp.OnebitState(comm=comm, warmup_steps=0, momentum=0.9,
                                   warmup_backend="squall")
    _alive.extend([comm, state])
    fut = squall.ddp.onebit_hook(state, _Bucket(torch.ones(numel)))
    thread = state._completer._thread
    until = time.monotonic() + 2
    while not fut.done() and not _in_torch(thread) and time.monotonic() < until:
        time.sleep(0.0001)
    sys.setswitchinterval(1.0)  # from here to finalisation this thread keeps the GIL
    gc.callbacks.append(_leave_early)
    # Returns: the interpreter finalises with the completion thread in the
    # middle of the bucket.


def _outcome(pid, err):
    _, status = os.waitpid(pid, 0)
    err.seek(0)
    text = err.read().decode(errors="replace")
    err.close()
    aborted = os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGABRT
    clean = os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0 and "terminate" not in text
    return aborted, clean, f"status {status}: {text.strip()[-400:]}"


def main():
    runs = int(sys.argv[1])
    numel = int(sys.argv[2]) if len(sys.argv) > 2 else 1 << 18
    jobs = int(sys.argv[3]) if len(sys.argv) > 3 else 2
    aborts = failures = started = 0
    first = None
    running = []
    while started < runs or running:
        while started < runs and len(running) < jobs:
            err = tempfile.TemporaryFile()
            pid = os.fork()
            if pid == 0:
                os.dup2(err.fileno(), 2)
                child(numel)
                return None  # the child ends the script here
            running.append((pid, err))
            started += 1
        pid, err = running.pop(0)
        aborted, clean, what = _outcome(pid, err)
        aborts += aborted
        failures += not clean and not aborted
        if not clean and first is None:
            first = what
    print(json.dumps({"runs": runs, "numel": numel, "torch": torch.__version__,
                      "aborts": aborts, "failures": failures, "first_failure": first}))
    return 1 if aborts or failures else 0


if __name__ == "__main__":
    rc = main()
    if rc is not None:
        sys.exit(rc)
