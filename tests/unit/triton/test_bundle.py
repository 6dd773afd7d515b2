"""The server read out of the nvidia-pytriton wheel: what is kept, where the stub goes, how it is found."""

import json
import os
import stat
import zipfile

import pytest

from schedsim.triton import bundle, server
from schedsim.triton.server import ServerError, TritonInstall, find_tritonserver, python_backend_dir

S = "pytriton/tritonserver/"
PY = bundle.python_version()


def fake_wheel(path, stubs=("3.12", PY)):
    """A wheel with the real one's layout (tiny files)."""
    with zipfile.ZipFile(path, "w") as z:
        def add(name, data=b"x", mode=0o644):
            info = zipfile.ZipInfo(name)
            info.external_attr = (stat.S_IFREG | mode) << 16
            z.writestr(info, data)
        add(S + "bin/tritonserver", b"#!/bin/sh\n", 0o755)
        add(S + "backends/python/libtriton_python.so")
        add(S + "backends/python/triton_python_backend_utils.py")
        add(S + "caches/local/libtritoncache_local.so")
        add(S + "__init__.py")  # pytriton's own Python package: left out
        for v in stubs:
            add(f"{S}python_backend_stubs/{v}/triton_python_backend_stub", v.encode(), 0o755)
        add("nvidia_pytriton.libs/libtritonserver-1.so")
        add("nvidia_pytriton.libs/libpython3-abc.13.so.1.0")
    return path


def test_extract_keeps_the_server_one_stub_and_the_libraries(tmp_path):
    root = bundle.extract(fake_wheel(tmp_path / "w.whl"), tmp_path / "out", "3.12")
    files = sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())
    assert files == sorted([
        "nvidia_pytriton.libs/libtritonserver-1.so", bundle.BUNDLE_MANIFEST,
        S + "bin/tritonserver", S + "backends/python/libtriton_python.so",
        S + "backends/python/triton_python_backend_stub", S + "backends/python/triton_python_backend_utils.py",
        S + "caches/local/libtritoncache_local.so"])
    assert (root / S / "backends/python/triton_python_backend_stub").read_bytes() == b"3.12"
    assert os.access(root / S / "bin/tritonserver", os.X_OK)
    assert json.loads((root / bundle.BUNDLE_MANIFEST).read_text())["python"] == "3.12"


def test_a_python_without_a_stub_is_refused(tmp_path):
    with pytest.raises(SystemExit, match="no stub for Python 3.7"):
        bundle.extract(fake_wheel(tmp_path / "w.whl"), tmp_path / "out", "3.7")


def test_pack_unpack_and_find_through_the_environment(tmp_path, monkeypatch):
    tarball = bundle.pack(tmp_path / "b" / "triton-py.tar.xz", PY, fake_wheel(tmp_path / "w.whl"), preset=0)
    monkeypatch.setenv(server.HOME_ENV, str(tarball))
    found = find_tritonserver()
    assert found.binary == tmp_path / "b" / "triton-py" / "triton" / S / "bin/tritonserver"
    assert found.source.startswith(f"{server.HOME_ENV} (bundle triton-py.tar.xz)")
    assert found.stub_python == PY and found.version() == bundle.TRITONSERVER_VERSION
    # The bundle's one stub is in place already: nothing to copy.
    assert python_backend_dir(found) == found.backend_dir
    assert find_tritonserver().binary == found.binary  # unpacked once, found again


def test_a_bundle_for_another_python_says_so(tmp_path, monkeypatch):
    other = "3.12" if PY != "3.12" else "3.10"
    root = bundle.extract(fake_wheel(tmp_path / "w.whl", stubs=(other,)), tmp_path / "home", other)
    monkeypatch.setenv(server.HOME_ENV, str(root))
    with pytest.raises(ServerError, match=f"stub for Python {other}, but this is Python {PY}"):
        python_backend_dir(find_tritonserver())


def test_the_wheel_layout_gets_this_pythons_stub_in_place_or_in_a_writable_copy(tmp_path, monkeypatch):
    with zipfile.ZipFile(fake_wheel(tmp_path / "w.whl")) as z:
        z.extractall(tmp_path / "site")
    root = tmp_path / "site" / S
    install = TritonInstall(binary=root / "bin/tritonserver", backend_dir=root / "backends",
                            lib_dir=tmp_path / "site/nvidia_pytriton.libs", source="test",
                            stubs_dir=root / "python_backend_stubs")
    assert python_backend_dir(install) == root / "backends"
    assert (root / "backends/python/triton_python_backend_stub").read_bytes() == PY.encode()
    # Read-only backends (root can write anywhere, so the check is stood in for): a copy
    # under the cache gets the stub, the original is untouched.
    (root / "backends/python/triton_python_backend_stub").unlink()
    monkeypatch.setattr(server, "_writable", lambda path: False)
    copy = python_backend_dir(install, cache_dir=tmp_path / "cache")
    assert copy.parent == tmp_path / "cache"
    assert (copy / "python/triton_python_backend_stub").read_bytes() == PY.encode()
    assert (copy / "python/libtriton_python.so").is_file()
    assert not (root / "backends/python/triton_python_backend_stub").exists()
    assert python_backend_dir(install, cache_dir=tmp_path / "cache") == copy  # made once


def test_path_comes_before_the_wheel(tmp_path, monkeypatch):
    (tmp_path / "opt/bin").mkdir(parents=True)
    (tmp_path / "opt/backends").mkdir()
    exe = tmp_path / "opt/bin/tritonserver"
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    monkeypatch.delenv(server.HOME_ENV, raising=False)
    monkeypatch.setenv("PATH", str(tmp_path / "opt/bin"))
    found = find_tritonserver()
    assert found.binary == exe and found.source == f"PATH: {exe}"
    assert found.backend_dir == tmp_path / "opt/backends" and found.lib_dir is None
    assert python_backend_dir(found) == tmp_path / "opt/backends"  # its own stub, untouched


def test_nothing_found_says_how_to_get_a_server(tmp_path, monkeypatch):
    monkeypatch.setenv(server.HOME_ENV, str(tmp_path / "nowhere"))
    with pytest.raises(ServerError, match="no bin/tritonserver there"):
        find_tritonserver()


def test_last_error_prefers_the_models_own_load_failure(tmp_path):
    log = tmp_path / "log"
    log.write_text("I1201 ok\nE1201 server.cc] \"CudaDriverHelper has not been initialized.\"\n"
                   "E1201 model_lifecycle.cc] \"failed to load 'm' version 1: Invalid argument: bad\"\n"
                   "Error: Failed to initialize NVML\nerror: creating server: Internal - failed to load all models\n")
    assert "failed to load 'm' version 1" in server.last_error(log)
    log.write_text("I1201 starting\nE1201 x.cc] \"boom\"\nI1201 after\n")
    assert server.last_error(log) == 'E1201 x.cc] "boom"'


USAGE_TEXT = ("Usage: tritonserver [options]\n  --help\n\tPrint usage\n\nLogging:\n  --log-error <boolean>\n"
              "\tEnable/disable error-level logging.\n  --load-model <string>\n"
              "\t--load-model argument will result in error. Note that this option will only\n\n")


@pytest.mark.parametrize("before, after, reason", [
    ("", "The server cannot listen to HTTP requests and GRPC requests at the same address and port 0.0.0.0:1\n",
     "The server cannot listen to HTTP requests and GRPC requests at the same address and port 0.0.0.0:1"),
    ("", 'Bad option: "--http-port".\nInvalid option value. Got abc\n',
     'Bad option: "--http-port". Invalid option value. Got abc'),
    ("/x/bin/tritonserver: unrecognized option '--bogus'\n", "", "/x/bin/tritonserver: unrecognized option '--bogus'"),
])
def test_last_error_gives_the_reason_a_command_line_was_rejected(tmp_path, before, after, reason):
    # Texts as tritonserver 2.51 prints them (its usage text shortened).
    log = tmp_path / "log"
    log.write_text(before + USAGE_TEXT + after)
    assert server.last_error(log) == reason


def test_free_ports_are_distinct_and_free():
    import socket

    for _ in range(50):
        ports = server.free_ports(6)
        assert len(set(ports)) == 6
    with socket.socket() as s:
        s.bind(("127.0.0.1", ports[0]))
