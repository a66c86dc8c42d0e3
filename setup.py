"""Builds zero_cpp's extension with the project's own CMake build, against
the torch installed in the Python that runs pip (no JIT build at import).

pip's build isolation hides that torch from this process; it is found by
asking the same interpreter without pip's isolation variables. Where
nvcc is found the CUDA side is built, as in the C++ build; without it the
CPU side alone. CMake, a C++17 compiler and the C++ dependencies the
README's `./run deps` installs are needed (nlohmann-json, Gloo's headers,
OpenSSL's libcrypto, liburing).

Environment: ZERO_CPP_CMAKE_BUILD_DIR, the CMake build directory to use
(default: build-pip in the source tree; one made for the same torch and
Python is reused, so a second install compiles only what changed);
ZERO_CPP_BUILD_JOBS.
"""
import glob
import os
import shutil
import subprocess
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

SOURCE = os.path.dirname(os.path.abspath(__file__))


def torch_of_this_python():
    """(torch's package directory, its version) for the interpreter running pip."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONNOUSERSITE", "PYTHONHOME")}
    code = "import os, torch; print(os.path.dirname(torch.__file__)); print(torch.__version__)"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    if r.returncode != 0:
        sys.exit("zero-cpp: the extension is built against the torch of the Python running pip "
                 f"({sys.executable}), which cannot import torch:\n{r.stderr.strip()}\n"
                 "install torch first (pip install torch), then zero-cpp")
    prefix, version = r.stdout.split()[:2]
    return prefix, version


class CMakeBuild(build_ext):
    def build_extension(self, ext):
        torch_prefix, torch_version = torch_of_this_python()
        build_dir = os.environ.get("ZERO_CPP_CMAKE_BUILD_DIR", os.path.join(SOURCE, "build-pip"))
        jobs = os.environ.get("ZERO_CPP_BUILD_JOBS", str(os.cpu_count() or 2))
        env = dict(os.environ)
        env.setdefault("CCACHE_BASEDIR", SOURCE)  # another build of this tree hits the same cache entries
        cmake = shutil.which("cmake")
        if cmake is None:
            sys.exit("zero-cpp: cmake is needed to build the extension (apt-get install cmake, or pip install cmake)")
        # A build directory made for another torch or Python (another
        # environment installing from this tree) starts over: CMake's cache
        # would keep the old one's libraries.
        target_of = f"{torch_prefix}\n{sys.executable}\n"
        stamp = os.path.join(build_dir, "zero-cpp-pip-target.txt")
        if os.path.isdir(build_dir) and (not os.path.isfile(stamp) or open(stamp).read() != target_of):
            if os.path.isfile(os.path.join(build_dir, "CMakeCache.txt")) and os.path.isfile(stamp):
                shutil.rmtree(build_dir)
        # Configured every time (cheap when nothing changed): a configure that
        # failed before (a dependency missing then) leaves a cache and no build files.
        gen = [] if os.path.isfile(os.path.join(build_dir, "CMakeCache.txt")) else (
            ["-G", "Ninja"] if shutil.which("ninja") else [])
        subprocess.run([cmake, "-S", SOURCE, "-B", build_dir, *gen, "-DCMAKE_BUILD_TYPE=Release",
                        f"-DCMAKE_PREFIX_PATH={torch_prefix}", f"-DTorch_DIR={torch_prefix}/share/cmake/Torch",
                        f"-DPython3_EXECUTABLE={sys.executable}", "-DZERO_BUILD_TESTS=OFF",
                        "-DZERO_BUILD_BENCH=OFF"], check=True, env=env)
        with open(stamp, "w") as f:
            f.write(target_of)
        subprocess.run([cmake, "--build", build_dir, "-j", jobs, "--target", "zero_cpp_python", "zero-run",
                        "zero-ckpt"], check=True, env=env)
        built = glob.glob(os.path.join(build_dir, "python", "zero_cpp", "_C*.so"))
        if not built:
            sys.exit(f"zero-cpp: the build in {build_dir} made no extension (was Python's development "
                     "header found? see CMake's 'no Python extension' note)")
        target = self.get_ext_fullpath(ext.name)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        shutil.copy2(built[0], target)
        package = os.path.dirname(target)
        os.makedirs(os.path.join(package, "bin"), exist_ok=True)
        for tool in ("zero-run", "zero-ckpt"):
            shutil.copy2(os.path.join(build_dir, tool), os.path.join(package, "bin", tool))
        with open(os.path.join(package, "_build_info.py"), "w") as f:
            f.write(f'"""Written by setup.py."""\ntorch_version = "{torch_version}"\n')


# setuptools' own build directory away from ./build (the project's CMake build),
# cleared first: setuptools copies the package into it and never removes a
# file, so a module since deleted or renamed would still be installed.
shutil.rmtree(os.path.join(SOURCE, "build-pip", "setuptools"), ignore_errors=True)
setup(ext_modules=[Extension("zero_cpp._C", sources=[])], cmdclass={"build_ext": CMakeBuild},
      options={"build": {"build_base": os.path.join("build-pip", "setuptools")}})
