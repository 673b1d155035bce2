"""Installs the `tessera` package from the repository with pip, offline:

    python3 -m venv --system-site-packages ENV     # Debian's numpy and torch stay visible
    ENV/bin/pip install --no-build-isolation --no-index worker/python

The extension is the one CMake builds (deploy/build.sh _tessera: the build folder ${TESSERA_BUILD_DIR:-build} of
the repository, configured there when it is not yet); pip copies it and the package's modules. Nothing is
downloaded: --no-build-isolation uses Debian's setuptools, --no-index refuses any index.
"""

import os
import pathlib
import shutil
import subprocess

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parents[1]


def build_dir():
    build = pathlib.Path(os.environ.get("TESSERA_BUILD_DIR", "build"))
    return build if build.is_absolute() else REPO / build


class BuildWithCMake(build_ext):
    """Builds tessera._tessera with the repository's own build (one build, the one the tests use)."""

    def build_extension(self, ext):
        subprocess.check_call(["bash", str(REPO / "deploy" / "build.sh"), "_tessera"])
        build = build_dir()
        built = sorted((build / "python" / "tessera").glob("_tessera*.so"))
        if not built:
            raise RuntimeError(f"no _tessera extension in {build / 'python' / 'tessera'}: pybind11-dev and "
                               "python3-dev are needed (deploy/install_deps.sh installs them)")
        target = pathlib.Path(self.get_ext_fullpath(ext.name))
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(built[0], target)


(build_dir() / "pip").mkdir(parents=True, exist_ok=True)
setup(
    name="tessera",
    version="0.1.0",
    description="Tessera's worker side for Python: the client library and tessera.torch",
    packages=["tessera", "tessera.torch"],
    ext_modules=[Extension("tessera._tessera", sources=[])],
    cmdclass={"build_ext": BuildWithCMake},
    python_requires=">=3.9",
    install_requires=["numpy"],
    # pip's own build files go to the build folder, not into the source tree.
    options={"build": {"build_base": str(build_dir() / "pip")},
             "egg_info": {"egg_base": str(build_dir() / "pip")}},
)
