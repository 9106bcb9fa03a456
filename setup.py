"""Build of mambaradix._C: the C core, the CPython binding and, when nvcc is
found, the CUDA kernels (cudart linked statically, so the module imports on
machines without a GPU or a CUDA runtime).

Environment knobs:
  MAMBARADIX_CUDA=auto|0|1    auto (default): CUDA if nvcc is found; 1: fail
                              without nvcc; 0: CPU-only build.
  MAMBARADIX_CUDA_ARCHS="90"  semicolon/comma list of SM versions; SASS for
                              each plus PTX of the highest.
  MAMBARADIX_DEBUG=1          -O0 -g -UNDEBUG -Werror; with MAMBARADIX_SANITIZE,
                              also -DMR_VERIFY_TRUSTED (csrc/core/common.h).
  MAMBARADIX_SANITIZE=1       ASan + UBSan (see README, "Debugging").
  NVCC_THREADS=N              nvcc -t N.
"""

import glob
import json
import os
import shutil
import subprocess
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext


def _flag(name, default="0"):
    return os.environ.get(name, default).strip().lower() not in ("", "0", "false", "no", "off")


def find_nvcc():
    cuda_home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    candidates = []
    if cuda_home:
        candidates.append(os.path.join(cuda_home, "bin", "nvcc"))
    candidates.append("/usr/local/cuda/bin/nvcc")
    which = shutil.which("nvcc")
    if which:
        candidates.append(which)
    for c in candidates:
        if c and os.path.isfile(c) and os.access(c, os.X_OK):
            return c
    return None


def cuda_home_of(nvcc):
    """The toolkit directory of nvcc (nvcc on PATH may be a wrapper script)."""
    for home in (os.environ.get("CUDA_HOME"), os.path.dirname(os.path.dirname(os.path.realpath(nvcc))),
                 "/usr/local/cuda"):
        if home and os.path.isfile(os.path.join(home, "include", "cuda_runtime.h")):
            return home
    sys.exit(f"nvcc found at {nvcc} but no CUDA toolkit (include/cuda_runtime.h); set CUDA_HOME")


CUDA_MODE = os.environ.get("MAMBARADIX_CUDA", "auto").strip().lower()
if CUDA_MODE not in ("auto", "0", "1"):
    sys.exit(f"MAMBARADIX_CUDA must be auto, 0 or 1, not {CUDA_MODE!r}")
NVCC = find_nvcc() if CUDA_MODE != "0" else None
if CUDA_MODE == "1" and NVCC is None:
    sys.exit("MAMBARADIX_CUDA=1 but nvcc was not found (set CUDA_HOME or put nvcc on PATH)")
WITH_CUDA = NVCC is not None
CUDA_HOME = cuda_home_of(NVCC) if NVCC else None

DEBUG = _flag("MAMBARADIX_DEBUG")
SANITIZE = _flag("MAMBARADIX_SANITIZE")
CUDA_ARCHS = [a.strip() for a in os.environ.get("MAMBARADIX_CUDA_ARCHS", "90").replace(";", ",").split(",")
              if a.strip()]
#: Everything a built _C depends on besides its sources (see BuildExt).
BUILD_CONFIG = {"nvcc": NVCC, "cuda_archs": CUDA_ARCHS if WITH_CUDA else None, "debug": DEBUG,
                "sanitize": SANITIZE, "python": sys.version}


class BuildExt(build_ext):
    """Compiles the .cu sources with nvcc into extra objects (CuPy's
    approach), then lets setuptools build the C sources and link."""

    def build_extension(self, ext):
        # A changed build knob must rebuild: setuptools only compares file
        # times, so a tree built with CUDA would otherwise reinstall its old
        # _C after MAMBARADIX_CUDA=0 (and the reverse).
        stamp = os.path.join(self.build_temp, "mambaradix-build-config.json")
        target = os.path.abspath(self.get_ext_fullpath(ext.name))
        try:
            with open(stamp) as f:
                built = json.load(f)
        except (OSError, ValueError):
            built = {}
        if built.get(target) != BUILD_CONFIG:
            self.force = True
        self._build_extension(ext)
        built[target] = BUILD_CONFIG
        os.makedirs(self.build_temp, exist_ok=True)
        with open(stamp, "w") as f:
            json.dump(built, f, indent=1, sort_keys=True)

    def _build_extension(self, ext):
        cu_sources = [s for s in ext.sources if s.endswith(".cu")]
        ext.sources = [s for s in ext.sources if not s.endswith(".cu")]
        if cu_sources:
            ext.extra_objects = list(ext.extra_objects or []) + self._nvcc_compile(ext, cu_sources)
        super().build_extension(ext)

    def _nvcc_compile(self, ext, sources):
        archs = CUDA_ARCHS
        gencode = [f"-gencode=arch=compute_{a},code=sm_{a}" for a in archs]
        top = max(archs, key=int)
        gencode.append(f"-gencode=arch=compute_{top},code=compute_{top}")
        objects = []
        for src in sources:
            obj = os.path.join(self.build_temp, os.path.splitext(src)[0] + ".o")
            os.makedirs(os.path.dirname(obj), exist_ok=True)
            deps = [src] + glob.glob("csrc/*/*.h") + glob.glob("csrc/cuda/*.cuh")
            if (not self.force and os.path.exists(obj)
                    and all(os.path.getmtime(obj) >= os.path.getmtime(d) for d in deps)):
                objects.append(obj)
                continue
            cmd = [NVCC, "-c", src, "-o", obj, "-std=c++17", "-Icsrc/core", "-Icsrc/tensor",
                   "-Xcompiler", "-fPIC", "-Xcompiler", "-fvisibility=hidden",
                   "-O0" if DEBUG else "-O3", "-lineinfo"] + gencode
            cmd += ["-DMR_WITH_CUDA=1"]
            threads = os.environ.get("NVCC_THREADS")
            if threads:
                cmd += ["-t", threads]
            print(" ".join(cmd), flush=True)
            subprocess.check_call(cmd)
            objects.append(obj)
        return objects


LAYERS = ("core", "tensor", "py")


def make_extension():
    import numpy

    # The layers (ARCHITECTURE.md): core (no Python), tensor (DLPack, state
    # pools, the kernels' C twins; no Python), py (the module and bindings).
    sources = [s for d in LAYERS for s in sorted(glob.glob(f"csrc/{d}/*.c"))]
    if WITH_CUDA:
        sources += sorted(glob.glob("csrc/cuda/*.cu"))
    define_macros = [("NPY_NO_DEPRECATED_API", "NPY_1_23_API_VERSION")]
    extra_compile_args = ["-std=c11", "-Wall", "-Wextra", "-Wno-unused-parameter",
                          "-Wno-missing-field-initializers", "-fvisibility=hidden"]
    extra_link_args = []
    libraries = []
    library_dirs = []
    if DEBUG or SANITIZE:
        define_macros.append(("MR_VERIFY_TRUSTED", "1"))   # csrc/core/common.h
    if DEBUG:
        extra_compile_args += ["-O0", "-g", "-UNDEBUG", "-Werror"]
    else:
        extra_compile_args += ["-O3"]
    if SANITIZE:
        san = ["-fsanitize=address,undefined", "-fno-sanitize-recover=all", "-fno-omit-frame-pointer", "-g"]
        extra_compile_args += san
        extra_link_args += san
    if WITH_CUDA:
        define_macros.append(("MR_WITH_CUDA", "1"))
        libraries += ["cudart_static", "rt", "pthread", "dl"]
        for sub in ("lib64", "lib", os.path.join("targets", "x86_64-linux", "lib")):
            d = os.path.join(CUDA_HOME, sub)
            if os.path.isdir(d):
                library_dirs.append(d)
        # nvcc-compiled objects need the C++ runtime bits of cudart_static.
        libraries += ["stdc++"]
    return Extension(
        "mambaradix._C",
        sources=sources,
        include_dirs=[f"csrc/{d}" for d in LAYERS] + [numpy.get_include()],
        depends=sorted(glob.glob("csrc/*/*.h")),
        define_macros=define_macros,
        extra_compile_args=extra_compile_args,
        extra_link_args=extra_link_args,
        libraries=libraries,
        library_dirs=library_dirs,
    )


setup(ext_modules=[make_extension()], cmdclass={"build_ext": BuildExt})
