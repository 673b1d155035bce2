"""pip installs the package from the repository offline, into a virtual environment that sees Debian's packages."""

import json
import subprocess
import sys

from conftest import BIN, REPO, child_environment


def test_pip_installs_the_package_offline_and_it_imports_from_the_environment(tmp_path):
    env_dir = tmp_path / "env"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(env_dir)], check=True)
    # The build folder the tests run from: the extension is already built there, so pip only copies it.
    env = child_environment(TESSERA_BUILD_DIR=BIN.parent)
    env.pop("PYTHONPATH", None)
    installed = subprocess.run([str(env_dir / "bin" / "pip"), "install", "--no-build-isolation", "--no-index",
                                str(REPO / "worker" / "python")], env=env, capture_output=True, text=True,
                               timeout=600)
    assert installed.returncode == 0, installed.stdout + installed.stderr
    found = subprocess.run([str(env_dir / "bin" / "python"), "-c",
                            "import tessera, tessera.torch; print(tessera.__file__); "
                            "print(tessera.BatchSchedule(8, 2, 2, 1, 0).batch(0).tolist())"],
                           env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert found.returncode == 0, found.stderr
    where, batch = found.stdout.splitlines()[:2]
    assert where.startswith(str(env_dir)), where
    assert len(json.loads(batch)) == 2
