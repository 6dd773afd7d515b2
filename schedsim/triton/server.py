"""Find, start and stop a real ``tritonserver``.

Where the server comes from, first match wins:

1. an explicit ``home`` argument, else the ``SCHEDSIM_TRITON_HOME`` environment variable:
   a directory holding ``bin/tritonserver`` (a Triton install, or the ``tritonserver``
   folder of the nvidia-pytriton wheel), a directory holding such a folder (an unpacked
   bundle of :mod:`schedsim.triton.bundle`), or the bundle's ``.tar.xz`` itself, unpacked
   next to it on first use;
2. ``tritonserver`` on ``PATH`` (a user's own install or NGC container), with the
   ``backends`` folder beside its ``bin`` when there is one, else the server's default;
3. the nvidia-pytriton wheel's copy, where that wheel is installed as a package;
4. the copy that ``python -m schedsim.triton.bundle install`` unpacked from that wheel
   into ``~/.cache/schedsim/triton/`` (the wheel's own package pins numpy<2, so schedsim
   reads the server out of it instead of installing it).

:attr:`TritonInstall.source` says which one was used.

The wheel ships the Python backend without its stub and keeps one stub per Python
version in ``python_backend_stubs/``; the backend looks for
``backends/python/triton_python_backend_stub``. :func:`python_backend_dir` puts the stub
of the running Python there, or, when that folder is not writable, into a writable copy
of the backends folder. The stub links ``libpython3.X.so``: the server is started with
the running interpreter's library directory on ``LD_LIBRARY_PATH``, so the stub embeds
the same Python as this process. The stub does not read ``PYTHONPATH``; this process's
``sys.path`` is passed in ``SCHEDSIM_TRITON_SYS_PATH`` for models to add (see
:mod:`schedsim.triton.python_model`).

:class:`TritonServer` starts the server on free ports with its log in a file, waits until
it is ready, and stops it with SIGINT (then SIGTERM, then SIGKILL after timeouts).
Failures are :class:`ServerError`: one line that names the log file.
"""

from __future__ import annotations

import contextlib
import filecmp
import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from schedsim.errors import InputError
from schedsim.triton.bundle import BUNDLE_MANIFEST, STUB, default_home

HOME_ENV = "SCHEDSIM_TRITON_HOME"
"""Environment variable naming a Triton install, an unpacked bundle or a bundle file."""
SYS_PATH_ENV = "SCHEDSIM_TRITON_SYS_PATH"
"""Environment variable through which the server's Python models get this process's sys.path."""


class ServerError(InputError):
    """tritonserver could not be found, would not start, or died: one line naming its log."""


@dataclass(frozen=True)
class TritonInstall:
    """A tritonserver binary and what it needs to run."""

    binary: Path
    """The tritonserver executable."""
    backend_dir: Path | None
    """--backend-directory to pass; None = the server's own default."""
    lib_dir: Path | None
    """The wheel's bundled shared libraries (put on LD_LIBRARY_PATH); None for an ordinary install."""
    source: str
    """Where it was found, in words, for messages and output files."""
    stubs_dir: Path | None = None
    """The wheel's python_backend_stubs/ (one stub per Python version); None when absent."""
    stub_python: str | None = None
    """A bundle's one stub is for this Python (``"3.12"``); None when not known."""

    def describe(self) -> dict:
        """JSON-ready description (for live.json and messages)."""
        return {"binary": str(self.binary), "source": self.source,
                "backend_dir": str(self.backend_dir) if self.backend_dir else None,
                "version": self.version()}

    def version(self) -> str | None:
        """The server's version as the wheel or bundle records it; None when unknown."""
        root = self.binary.parent.parent
        for manifest in (root.parent.parent / BUNDLE_MANIFEST, root / BUNDLE_MANIFEST):
            if manifest.is_file():
                return json.loads(manifest.read_text()).get("tritonserver_version")
        if self.lib_dir is not None:
            try:
                from importlib.metadata import version

                return f"nvidia-pytriton {version('nvidia-pytriton')}"
            except Exception:  # noqa: BLE001 - unknown is a fine answer
                return None
        return None


def python_version() -> str:
    """The running Python as ``major.minor``: the stub that must be used."""
    return f"{sys.version_info.major}.{sys.version_info.minor}"


def _from_server_root(root: Path, source: str) -> TritonInstall | None:
    """A TritonInstall for ``root/bin/tritonserver`` (an install or the wheel's tritonserver/)."""
    binary = root / "bin" / "tritonserver"
    if not binary.is_file():
        return None
    libs = root.parent.parent / "nvidia_pytriton.libs"  # the wheel's layout: bin/../../../nvidia_pytriton.libs
    stubs = root / "python_backend_stubs"
    stub_python = None
    manifest = root.parent.parent / BUNDLE_MANIFEST
    if manifest.is_file():
        stub_python = json.loads(manifest.read_text()).get("python")
    return TritonInstall(binary=binary,
                         backend_dir=root / "backends" if (root / "backends").is_dir() else None,
                         lib_dir=libs if libs.is_dir() else None, source=source,
                         stubs_dir=stubs if stubs.is_dir() else None, stub_python=stub_python)


def _from_home(home: str | os.PathLike, what: str) -> TritonInstall:
    path = Path(home).expanduser()
    if path.is_file() and path.name.endswith((".tar.xz", ".tar.gz", ".tar")):
        from schedsim.triton.bundle import unpack

        path = unpack(path)
        what = f"{what} (bundle {Path(home).name})"
    for root in (path, path / "pytriton" / "tritonserver", path / "triton" / "pytriton" / "tritonserver",
                 path / "tritonserver"):
        found = _from_server_root(root, f"{what}: {root}")
        if found is not None:
            return found
    raise ServerError(f"{what}: {path}: no bin/tritonserver there (expected a Triton install, "
                      "an unpacked bundle, or a bundle .tar.xz)")


def find_tritonserver(home: str | os.PathLike | None = None) -> TritonInstall:
    """The tritonserver to use (see the module docstring for the order); ServerError when none."""
    if home is not None:
        return _from_home(home, "--triton-home")
    if os.environ.get(HOME_ENV):
        return _from_home(os.environ[HOME_ENV], HOME_ENV)
    on_path = shutil.which("tritonserver")
    if on_path:
        binary = Path(on_path).resolve()
        found = _from_server_root(binary.parent.parent, f"PATH: {binary}")
        return found or TritonInstall(binary=binary, backend_dir=None, lib_dir=None, source=f"PATH: {binary}")
    try:
        import importlib.util

        spec = importlib.util.find_spec("pytriton")
    except (ImportError, ValueError):
        spec = None
    if spec is not None and spec.submodule_search_locations:
        for loc in spec.submodule_search_locations:
            found = _from_server_root(Path(loc) / "tritonserver", "nvidia-pytriton wheel")
            if found is not None:
                return found
    found = _from_server_root(default_home() / "pytriton" / "tritonserver",
                              f"python -m schedsim.triton.bundle install: {default_home()}")
    if found is not None:
        return found
    raise ServerError("tritonserver not found: run python -m schedsim.triton.bundle install (it unpacks the "
                      f"server from the nvidia-pytriton wheel), put tritonserver on PATH, or set {HOME_ENV} "
                      "to a Triton install or a bundle made by python -m schedsim.triton.bundle pack")


def _writable(path: Path) -> bool:
    return os.access(path, os.W_OK | os.X_OK)


def _place(src: Path, dst: Path) -> None:
    """Copy ``src`` to ``dst`` atomically (a temporary name, then a rename): several
    processes may install the same stub at once."""
    tmp = dst.with_name(f".{dst.name}.{os.getpid()}.tmp")
    shutil.copy2(src, tmp)
    os.replace(tmp, dst)


def python_backend_dir(install: TritonInstall, cache_dir: str | os.PathLike | None = None) -> Path | None:
    """The --backend-directory to start ``install`` with, its Python backend holding the
    stub of the running Python; None to leave the server's default (an ordinary install,
    whose own stub is used).

    The stub is copied from the wheel's python_backend_stubs/ into backends/python/ when
    it is missing or is another version's. When backends/ is not writable, a copy of it
    under ``cache_dir`` (default ``~/.cache/schedsim/triton``) gets the stub instead.
    """
    if install.backend_dir is None or install.lib_dir is None:
        return install.backend_dir
    want = python_version()
    stub_src = install.stubs_dir / want / STUB if install.stubs_dir else None
    target = install.backend_dir / "python" / STUB
    if stub_src is None or not stub_src.is_file():
        # A bundle carries the one stub it was built for, already in place.
        if target.is_file() and install.stub_python in (None, want):
            return install.backend_dir
        have = f"Python {install.stub_python}" if install.stub_python else "no Python"
        raise ServerError(f"{install.source}: its Python backend has a stub for {have}, but this is "
                          f"Python {want}; build a bundle for it (python -m schedsim.triton.bundle "
                          f"--python {want} OUT.tar.xz) or run under Python {install.stub_python}")
    if target.is_file() and filecmp.cmp(stub_src, target, shallow=False):
        return install.backend_dir
    if _writable(install.backend_dir / "python"):
        _place(stub_src, target)
        return install.backend_dir
    base = Path(cache_dir) if cache_dir else Path.home() / ".cache" / "schedsim" / "triton"
    key = hashlib.sha256(str(install.backend_dir.resolve()).encode()).hexdigest()[:12]
    copy = base / f"backends-{key}-py{want}"
    if not (copy / "python" / STUB).is_file():
        tmp = base / f".backends-{key}-py{want}.{os.getpid()}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.copytree(install.backend_dir, tmp, ignore=shutil.ignore_patterns("__pycache__"))
        shutil.copy2(stub_src, tmp / "python" / STUB)
        try:
            os.replace(tmp, copy)
        except OSError:  # another process made it first
            shutil.rmtree(tmp, ignore_errors=True)
    return copy


def server_env(install: TritonInstall, extra: dict | None = None) -> dict:
    """The server's environment: the wheel's libraries and this Python's libpython on
    LD_LIBRARY_PATH, this process's sys.path in SCHEDSIM_TRITON_SYS_PATH."""
    env = dict(os.environ)
    libs = [str(install.lib_dir)] if install.lib_dir else []
    libdir = sysconfig.get_config_var("LIBDIR")
    if libdir and Path(libdir).is_dir():
        libs.append(libdir)
    if env.get("LD_LIBRARY_PATH"):
        libs.append(env["LD_LIBRARY_PATH"])
    if libs:
        env["LD_LIBRARY_PATH"] = os.pathsep.join(libs)
    # Absolute: the stub does not run in this process's working directory.
    env[SYS_PATH_ENV] = os.pathsep.join(os.path.abspath(p) for p in sys.path if p and Path(p).is_dir())
    env.update(extra or {})
    return env


PORT_FIELDS = ("http_port", "grpc_port", "metrics_port")
PORT_ATTEMPTS = 3
"""Starts tried when a port chosen free is taken before tritonserver binds it."""


def free_ports(count: int) -> list[int]:
    """``count`` distinct TCP ports nobody listens on now (the OS's choice).

    The sockets stay open until all are chosen: ports asked for one at a time can
    repeat, and tritonserver refuses to start with its HTTP and gRPC ports equal.
    """
    with contextlib.ExitStack() as stack:
        socks = [stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) for _ in range(count)]
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]


def last_error(log_path: Path, limit: int = 240) -> str:
    """The most telling line of a server log: its last error line, else its last line."""
    try:
        raw = Path(log_path).read_text(errors="replace").splitlines()
    except OSError:
        return ""
    usage = usage_complaint(raw)
    lines = [ln.strip() for ln in raw if ln.strip()]
    # A model that failed to load says why on its own line; the server's last line only
    # says "failed to load all models".
    load = [ln for ln in lines if "failed to load '" in ln]
    errors = [ln for ln in lines if ln[:1] == "E" and ln[1:5].isdigit()
              or "error" in ln.lower() and "nvml" not in ln.lower() and "dcgm" not in ln.lower()]
    line = usage or (load[0] if load else (errors or lines or [""])[-1])
    return line if len(line) <= limit else line[:limit] + "..."


def usage_complaint(lines: list[str]) -> str:
    """What tritonserver said about its command line, "" when it printed no usage text.

    A rejected option prints the whole usage text (whose help lines mention "error")
    with the reason before it ("unrecognized option") or after it ("Bad option",
    "cannot listen ... at the same address and port"): the reason is the unindented
    lines that are neither the "Usage:" line nor a section heading.
    """
    start = next((i for i, ln in enumerate(lines) if ln.startswith("Usage: tritonserver")), None)
    if start is None:
        return ""
    said = [ln.strip() for i, ln in enumerate(lines)
            if i != start and ln.strip() and not ln[:1].isspace() and not ln.rstrip().endswith(":")]
    return " ".join(said) or "tritonserver rejected its command line"


@dataclass
class TritonServer:
    """A tritonserver process serving ``repository``: a context manager.

    On entry it starts the server (free ports unless given), writes its output to
    ``log_path`` and waits until it and every model are ready; on exit it stops it.
    ``url`` is the HTTP endpoint as ``host:port``.
    """

    repository: Path
    """The model repository."""
    log_path: Path
    """Where the server's stdout and stderr go."""
    install: TritonInstall | None = None
    """Which server; None = :func:`find_tritonserver`."""
    args: tuple[str, ...] = ()
    """Further command-line options (e.g. --trace-config ...)."""
    ready_timeout_s: float = 120.0
    """How long to wait for readiness before giving up."""
    stop_timeout_s: float = 20.0
    """After SIGINT, how long before SIGTERM (and as long again before SIGKILL)."""
    env: dict | None = None
    """Extra environment variables for the server (and its Python stubs)."""
    cache_dir: Path | None = None
    """Where a writable copy of a read-only backends folder goes (see python_backend_dir)."""
    http_port: int = 0
    grpc_port: int = 0
    metrics_port: int = 0
    proc: subprocess.Popen | None = field(default=None, init=False)
    returncode: int | None = field(default=None, init=False)
    command: list = field(default_factory=list, init=False)
    started_s: float = field(default=0.0, init=False)
    """Seconds from the start to readiness."""

    @property
    def url(self) -> str:
        return f"127.0.0.1:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    def describe(self) -> dict:
        return (self.install.describe() if self.install else {}) | {
            "command": [str(c) for c in self.command], "log": str(self.log_path),
            "ready_after_s": round(self.started_s, 3), "returncode": self.returncode}

    def placement(self) -> list[dict]:
        """Where the server's processes sit on the host, read from Linux's /proc: for
        tritonserver and every process under it (the Python backend's stubs), the CPUs it may
        run on and the one it last ran on. A Python-backend batch is mostly CPU work, and
        fresh servers on one machine have run the same batches up to 1.3x apart; this is
        what a run can record of why. Empty where /proc cannot be read or the server is gone."""
        out, pids = [], [self.proc.pid] if self.proc is not None else []
        while pids:
            pid = pids.pop()
            try:
                stat = Path(f"/proc/{pid}/stat").read_text()
                status = Path(f"/proc/{pid}/status").read_text()
                children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
            except OSError:
                continue
            allowed = next((line.split(":", 1)[1].strip() for line in status.splitlines()
                            if line.startswith("Cpus_allowed_list")), "")
            out.append({"pid": pid, "name": stat.split("(", 1)[1].rsplit(")", 1)[0],
                        "last_cpu": int(stat.rsplit(")", 1)[1].split()[36]), "cpus_allowed": allowed})
            pids += [int(c) for c in children]
        return out

    def __enter__(self) -> "TritonServer":
        chosen = [name for name in PORT_FIELDS if not getattr(self, name)]
        attempt = 1
        while True:
            self.start()
            try:
                self.wait_ready()
                return self
            except ServerError as exc:
                self.stop()
                # A port chosen free can be taken by another process before the server
                # binds it: choose again rather than fail the run.
                if not chosen or "already in use" not in str(exc) or attempt == PORT_ATTEMPTS:
                    raise
                for name in chosen:
                    setattr(self, name, 0)
                attempt += 1
            except BaseException:
                self.stop()
                raise

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> None:
        """Start the process (not waiting for readiness)."""
        if self.install is None:
            self.install = find_tritonserver()
        backend_dir = python_backend_dir(self.install, self.cache_dir)
        missing = [name for name in PORT_FIELDS if not getattr(self, name)]
        if missing:
            given = {getattr(self, name) for name in PORT_FIELDS} - {0}
            ports = iter(p for p in free_ports(len(missing) + len(given)) if p not in given)
            for name in missing:
                setattr(self, name, next(ports))
        self.command = [str(self.install.binary), f"--model-repository={self.repository}",
                        f"--http-port={self.http_port}", f"--grpc-port={self.grpc_port}",
                        f"--metrics-port={self.metrics_port}", "--exit-timeout-secs=10",
                        *([f"--backend-directory={backend_dir}"] if backend_dir else []), *self.args]
        self.log_path = Path(self.log_path)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._t0 = time.monotonic()
        with open(self.log_path, "wb") as log:
            try:
                # Its own session: a Ctrl-C meant for schedsim must not reach the server
                # before schedsim has read its statistics; stop() signals it.
                self.proc = subprocess.Popen(self.command, stdout=log, stderr=subprocess.STDOUT,
                                             stdin=subprocess.DEVNULL, env=server_env(self.install, self.env),
                                             start_new_session=True)
            except OSError as exc:
                raise ServerError(f"cannot start {self.install.binary}: {exc.strerror or exc}") from None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def _died(self, when: str) -> ServerError:
        code = self.proc.poll() if self.proc else None
        self.returncode = code
        how = f"was killed by signal {-code}" if code is not None and code < 0 else f"exited with code {code}"
        detail = last_error(self.log_path)
        return ServerError(f"tritonserver {how} {when}" + (f": {detail}" if detail else "")
                           + f" (log: {self.log_path})")

    def check(self, when: str = "during the run") -> None:
        """ServerError when the process has exited."""
        if not self.alive():
            raise self._died(when)

    def get(self, path: str, timeout: float = 5.0) -> tuple[int, bytes]:
        """(HTTP status, body) of GET http://url/path; status 0 when nothing answered."""
        try:
            with urllib.request.urlopen(f"http://{self.url}{path}", timeout=timeout) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()
        except (urllib.error.URLError, OSError):
            return 0, b""

    def wait_ready(self) -> None:
        """Poll /v2/health/ready until 200; ServerError if the server exits or time runs out."""
        deadline = self._t0 + self.ready_timeout_s
        while True:
            if not self.alive():
                raise self._died("before it was ready")
            if self.get("/v2/health/ready", timeout=1.0)[0] == 200:
                self.started_s = time.monotonic() - self._t0
                return
            if time.monotonic() > deadline:
                raise ServerError(f"tritonserver was not ready after {self.ready_timeout_s:g} s"
                                  + (f": {last_error(self.log_path)}" if last_error(self.log_path) else "")
                                  + f" (log: {self.log_path})")
            time.sleep(0.05)

    def stop(self) -> int | None:
        """Stop the server (SIGINT, then SIGTERM, then SIGKILL); its exit code."""
        if self.proc is None:
            return self.returncode
        if self.proc.poll() is None:
            for sig, wait in ((signal.SIGINT, self.stop_timeout_s), (signal.SIGTERM, self.stop_timeout_s),
                              (signal.SIGKILL, 10.0)):
                try:
                    self.proc.send_signal(sig)
                except ProcessLookupError:
                    break
                try:
                    self.proc.wait(timeout=wait)
                    break
                except subprocess.TimeoutExpired:
                    continue
        self.returncode = self.proc.poll()
        return self.returncode
