"""Just the server out of the nvidia-pytriton wheel: installed for this Python, or packed to carry.

The nvidia-pytriton wheel (55 MB) holds tritonserver 2.51 with its Python backend, one
backend stub per Python version and the shared libraries they link. Its Python package
pins ``numpy<2``, which would downgrade numpy in schedsim's environment (and pyarrow then
refuses to import), so schedsim never installs the wheel as a package: it reads the
server out of it.

``python -m schedsim.triton.bundle install`` downloads the wheel with pip (``pip download
--no-deps``) and unpacks ``bin/tritonserver``, ``backends/python`` with the running
Python's stub, and the libraries into ``~/.cache/schedsim/triton/``, where
:func:`schedsim.triton.server.find_tritonserver` looks. ``python -m schedsim.triton.bundle
pack OUT.tar.xz --python 3.12`` writes the same for a given Python as an xz tarball
(about 35 MB) to carry to a machine without a registry; there, point
``SCHEDSIM_TRITON_HOME`` at the tarball (it is unpacked next to itself on first use).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

WHEEL = "nvidia-pytriton==0.7.0"
"""The wheel the server comes from (tritonserver 2.51)."""
TRITONSERVER_VERSION = "2.51"
BUNDLE_MANIFEST = "schedsim-triton-bundle.json"
_SERVER = "pytriton/tritonserver/"
_LIBS = "nvidia_pytriton.libs/"
STUB = "triton_python_backend_stub"


def python_version() -> str:
    return f"{sys.version_info.major}.{sys.version_info.minor}"


def default_home(python: str | None = None) -> Path:
    """Where ``install`` puts the server for ``python`` (default: the running one)."""
    return Path.home() / ".cache" / "schedsim" / "triton" / f"tritonserver-{TRITONSERVER_VERSION}-py{python or python_version()}"


def fetch_wheel(dest: str | Path) -> Path:
    """Download the wheel (pip download --no-deps) into ``dest``; its path."""
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                           "--quiet", "--dest", str(dest), WHEEL], capture_output=True, text=True)
    wheels = sorted(dest.glob("nvidia_pytriton-*.whl"))
    if proc.returncode != 0 or not wheels:
        last = (proc.stderr.strip().splitlines() or ["no wheel downloaded"])[-1]
        raise SystemExit(f"schedsim.triton.bundle: pip download {WHEEL} failed: {last}")
    return wheels[-1]


def _wanted(name: str, python: str) -> str | None:
    """The member's path in the unpacked server, or None to leave it out."""
    if name.endswith("/") or "__pycache__" in name:
        return None
    if name.startswith(_SERVER + "bin/") or name.startswith(_SERVER + "backends/python/") \
            or name.startswith(_SERVER + "caches/"):
        return name
    if name == f"{_SERVER}python_backend_stubs/{python}/{STUB}":
        return f"{_SERVER}backends/python/{STUB}"
    if name.startswith(_LIBS):
        # The bundled libpython is linked only by the stub of the newest Python (3.13).
        if os.path.basename(name).startswith("libpython") and python != "3.13":
            return None
        return name
    return None


def extract(wheel: str | Path, root: str | Path, python: str | None = None) -> Path:
    """Unpack the server for ``python`` from ``wheel`` into ``root`` (made fresh); return ``root``."""
    python = python or python_version()
    root = Path(root)
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        if f"{_SERVER}python_backend_stubs/{python}/{STUB}" not in names:
            have = sorted({n.split("/")[3] for n in names if n.startswith(_SERVER + "python_backend_stubs/")
                           and n.count("/") >= 4})
            raise SystemExit(f"schedsim.triton.bundle: {Path(wheel).name} has no stub for Python {python} "
                             f"(it has {', '.join(have)})")
        for info in z.infolist():
            target = _wanted(info.filename, python)
            if target is None:
                continue
            path = root / target
            path.parent.mkdir(parents=True, exist_ok=True)
            with z.open(info) as src, open(path, "wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
            mode = (info.external_attr >> 16) & 0o777
            os.chmod(path, mode or (0o755 if "/bin/" in target or target.endswith(STUB) or ".so" in target
                                    else 0o644))
    (root / BUNDLE_MANIFEST).write_text(json.dumps({
        "python": python, "wheel": Path(wheel).name, "tritonserver_version": TRITONSERVER_VERSION}, indent=1) + "\n")
    return root


def install(wheel: str | Path | None = None, dest: str | Path | None = None) -> Path:
    """Unpack the server for the running Python into ``dest`` (default :func:`default_home`)."""
    dest = Path(dest) if dest else default_home()
    if (dest / BUNDLE_MANIFEST).is_file():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dest.parent) as tmp:
        wheel = Path(wheel) if wheel else fetch_wheel(Path(tmp) / "wheel")
        staged = extract(wheel, Path(tmp) / "server")
        try:
            os.replace(staged, dest)
        except OSError:  # made by another process meanwhile
            if not (dest / BUNDLE_MANIFEST).is_file():
                raise
    return dest


def pack(out: str | Path, python: str, wheel: str | Path | None = None, preset: int = 6) -> Path:
    """Write the server for ``python`` as an xz tarball (one folder, ``triton/``)."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        wheel = Path(wheel) if wheel else fetch_wheel(Path(tmp) / "wheel")
        staged = extract(wheel, Path(tmp) / "triton", python)
        part = out.with_name(out.name + ".part")
        with tarfile.open(part, "w:xz", preset=preset) as tar:
            tar.add(staged, arcname="triton")
        os.replace(part, out)
    return out


def unpack(bundle: str | Path, dest: str | Path | None = None) -> Path:
    """Unpack a tarball made by :func:`pack` (once) into ``dest`` (default: beside it, named
    after it); return the folder that holds ``triton/``."""
    bundle = Path(bundle)
    dest = Path(dest) if dest else bundle.with_name(bundle.name.split(".tar")[0])
    if (dest / "triton" / BUNDLE_MANIFEST).is_file():
        return dest / "triton"
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=dest.parent, prefix=f".{dest.name}."))
    with tarfile.open(bundle) as tar:
        tar.extractall(tmp, filter="data")
    try:
        os.replace(tmp, dest)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
    return dest / "triton"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m schedsim.triton.bundle", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p_install = sub.add_parser("install", help="unpack the server for this Python into ~/.cache/schedsim/triton")
    p_install.add_argument("--wheel", help="a downloaded nvidia-pytriton wheel (default: pip download it)")
    p_install.add_argument("--dest", help="where to unpack (default: %(default)s)", default=None)
    p_pack = sub.add_parser("pack", help="write the server for one Python as OUT.tar.xz")
    p_pack.add_argument("out", help="the tarball to write, e.g. .triton/triton-py3.12.tar.xz")
    p_pack.add_argument("--python", default=python_version(), help="the stub's Python (default: this one)")
    p_pack.add_argument("--wheel", help="a downloaded nvidia-pytriton wheel (default: pip download it)")
    args = parser.parse_args(argv)
    if args.command == "install":
        home = install(args.wheel, args.dest)
        print(f"tritonserver {TRITONSERVER_VERSION} for Python {python_version()} in {home}")
    else:
        out = pack(args.out, args.python, args.wheel)
        print(f"wrote {out} ({out.stat().st_size / 2**20:.1f} MiB, tritonserver {TRITONSERVER_VERSION}, "
              f"Python {args.python} stub)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
