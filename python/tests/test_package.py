"""The package as a user installs it: a wheel with the library inside, into a
fresh virtual environment (Debian's PEP 668 route), imported from outside the
checkout with no SQUALL_LIBRARY. Before, the installed package could not find
the library."""

import glob
import os
import shutil
import subprocess
import sys
import tempfile

import pytest

import squall

HERE = os.path.dirname(os.path.abspath(__file__))
PYTHON_DIR = os.path.dirname(HERE)


def _have(module):
    return subprocess.run([sys.executable, "-c", f"import {module}"],
                          capture_output=True).returncode == 0


@pytest.mark.skipif(not _have("wheel") or not _have("venv"),
                    reason="needs python3-wheel and python3-venv (scripts/setup.sh installs them)")
def test_wheel_installs_into_a_fresh_venv_and_finds_its_library():
    tmp = tempfile.mkdtemp(prefix="squall-wheel-")
    try:
        src = os.path.join(tmp, "src")  # a copy: the build must not need the checkout
        shutil.copytree(PYTHON_DIR, src, ignore=shutil.ignore_patterns(
            "tests", "build", "__pycache__", "*.egg-info"))
        env = {k: v for k, v in os.environ.items()
               if k not in ("SQUALL_LIBRARY", "PYTHONPATH")}
        env["SQUALL_WHEEL_LIBRARY"] = squall.library_path
        r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps",
                            "--no-build-isolation", "-q", "-w", os.path.join(tmp, "dist"), src],
                           capture_output=True, text=True, env=env, timeout=120)
        assert r.returncode == 0, r.stdout + r.stderr
        wheels = glob.glob(os.path.join(tmp, "dist", "squall-*.whl"))
        assert len(wheels) == 1 and "-py3-none-linux_" in wheels[0], wheels
        venv = os.path.join(tmp, "venv")
        # Without its own pip (faster); this Python's pip installs into it.
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", venv], check=True,
                       timeout=120)
        env.pop("SQUALL_WHEEL_LIBRARY")
        r = subprocess.run([sys.executable, "-m", "pip", "--python",
                            os.path.join(venv, "bin", "python"), "install", "-q", "--no-index",
                            wheels[0]], capture_output=True, text=True, env=env, timeout=120)
        assert r.returncode == 0, r.stdout + r.stderr
        code = ("import squall; c = squall.Communicator.from_unique_id(squall.get_unique_id(), "
                "1, 0, 'tcp'); c.barrier(); print(squall.library_path, squall.version())")
        env["SQUALL_SOCKET_IFNAME"] = "lo"
        r = subprocess.run([os.path.join(venv, "bin", "python"), "-c", code],
                           capture_output=True, text=True, env=env, cwd=tmp, timeout=60)
        assert r.returncode == 0, r.stderr
        lib, version = r.stdout.split()[:2]
        assert lib.startswith(venv) and lib.endswith("squall/_libs/libsquall.so"), lib
        assert version == squall.__version__
        for script in ("squallrun", "squall"):
            assert os.path.exists(os.path.join(venv, "bin", script)), script
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

