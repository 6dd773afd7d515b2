"""Running independent jobs in parallel: local processes, or tasks on a Ray cluster.

Both yield ``(index, result)`` as each job finishes. A job's result depends only on its
arguments (every cell carries its own seed), so the two executors give the same results;
only the order they arrive in differs, and callers sort.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import socket
import sys
from typing import Callable, Iterator

from schedsim.errors import InputError

EXECUTORS = ("local", "ray")

# Forked workers start at once with everything the parent imported (a spawned worker imports
# schedsim again, about 1 s); elsewhere fork is not safe (macOS), so they are spawned.
_START = "fork" if sys.platform.startswith("linux") else "spawn"


def _worker_init(parent: int) -> None:
    # Ctrl-C is the parent's to handle (it keeps what is done); a worker that saw it too
    # would print a traceback per process.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if sys.platform.startswith("linux"):
        # A worker dies with the command, even one killed by SIGKILL: no orphan keeps a core.
        import ctypes  # lazy: workers only

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        if os.getppid() != parent:
            os._exit(1)  # the parent died before prctl took effect


class _Indexed:
    """``(i, fn(*job))`` for ``(i, job)``: picklable, unlike a closure."""

    def __init__(self, fn: Callable):
        self.fn = fn

    def __call__(self, item):
        i, job = item
        return i, self.fn(*job)


def run_local(fn: Callable, jobs: list, workers: int | None) -> Iterator[tuple[int, object]]:
    """``fn(*job)`` for every job in a pool of worker processes, forked where that is safe.

    The workers end with the iteration: joined when every job is done, terminated when the
    caller stops early (an error, Ctrl-C, a closed generator); and on Linux they die with
    the parent process, however it ends."""
    workers = max(1, min(workers or os.cpu_count() or 1, len(jobs)))
    pool = multiprocessing.get_context(_START).Pool(workers, initializer=_worker_init, initargs=(os.getpid(),))
    try:
        yield from pool.imap_unordered(_Indexed(fn), enumerate(jobs))
    except BaseException:
        pool.terminate()
        raise
    else:
        pool.close()
    finally:
        pool.join()


def check_ray_address(address: str) -> None:
    """Fail fast, in one line, when a ``host:port`` (or ``ray://host:port``) does not answer;
    ray.init would otherwise retry for a long while."""
    if address in ("auto", "local"):
        return
    target = address.removeprefix("ray://")
    host, sep, port = target.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise InputError(f"--ray-address: {address!r} is not HOST:PORT, ray://HOST:PORT or auto")
    try:
        socket.create_connection((host, int(port)), timeout=5).close()
    except OSError as exc:
        raise InputError(f"--ray-address: cannot reach {address}: {exc.strerror or exc}") from None


def ray_init(address: str | None, workers: int | None):
    """Connect to a Ray cluster (or start a local one); return the ray module."""
    try:
        import ray  # lazy: an optional package, for --executor ray only
    except ImportError:
        raise InputError("--executor ray: Ray is not installed; pip install 'schedsim[ray]'") from None
    if ray.is_initialized():
        return ray
    if address:
        check_ray_address(address)
    kwargs = dict(include_dashboard=False, log_to_driver=False, logging_level="ERROR",
                  configure_logging=False)
    try:
        if address:
            ray.init(address=address, **kwargs)
        else:
            ray.init(num_cpus=workers, **kwargs)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise InputError(f"--ray-address: cannot connect to {address or 'a local Ray'}: "
                         f"{' '.join(str(exc).split())[:300]}") from None
    return ray


def run_ray(fn: Callable, jobs: list, address: str | None, workers: int | None
            ) -> Iterator[tuple[int, object]]:
    """``fn(*job)`` for every job as a Ray task, one CPU each."""
    ray = ray_init(address, workers)
    remote = ray.remote(num_cpus=1, max_retries=0)(fn)
    refs = {remote.remote(*job): i for i, job in enumerate(jobs)}
    try:
        while refs:
            done, _ = ray.wait(list(refs), num_returns=1)
            for ref in done:
                yield refs.pop(ref), ray.get(ref)
    finally:
        for ref in refs:
            ray.cancel(ref)


def run_jobs(fn: Callable, jobs: list, executor: str = "local", workers: int | None = None,
             ray_address: str | None = None) -> Iterator[tuple[int, object]]:
    if executor not in EXECUTORS:
        raise InputError(f"--executor: {executor!r} is not valid; expected local or ray")
    if workers is not None and workers < 1:
        raise InputError(f"--workers: {workers} is not valid; expected an integer >= 1")
    if not jobs:
        return iter(())
    if executor == "ray":
        return run_ray(fn, jobs, ray_address, workers)
    if ray_address:
        raise InputError("--ray-address: only with --executor ray")
    if workers == 1:
        return ((i, fn(*job)) for i, job in enumerate(jobs))  # no pool: quick for tiny sweeps
    return run_local(fn, jobs, workers)
