"""Builds loom_torch against the python and torch that run this script, on a machine without
CMake, TBB or Boost (the GPU machine of bench/gpu/device_check.sh): the extension's sources from
the source tree, compiled with torch's own flags and headers and linked to a libloom built
elsewhere (the bundle's, with its generated config.hpp).

    python3 bench/gpu/build_loom_torch.py --lib BUNDLE/lib --config BUNDLE/include --out DIR

DIR/loom_torch then holds the Python files, _C and libloom (PYTHONPATH=DIR imports it). Says
what is missing (Python's headers, a compiler) instead of failing inside the compiler.
"""
import argparse
import concurrent.futures
import glob
import os
import shutil
import subprocess
import sys
import sysconfig
import time

import torch
from torch.utils import cpp_extension


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", required=True, help="directory with libloom.so.0")
    ap.add_argument("--config", required=True, help="directory with loom/config.hpp")
    ap.add_argument("--out", required=True)
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 4)
    args = ap.parse_args()
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    python_include = sysconfig.get_paths()["include"]
    if not os.path.exists(os.path.join(python_include, "Python.h")):
        sys.exit("build_loom_torch: no Python.h in %s (this python has no development headers)"
                 % python_include)
    compiler = shutil.which(os.environ.get("CXX", "g++"))
    if compiler is None:
        sys.exit("build_loom_torch: no C++ compiler (g++ or $CXX) on PATH")
    if not os.path.exists(os.path.join(args.lib, "libloom.so.0")):
        sys.exit("build_loom_torch: no libloom.so.0 in %s" % args.lib)
    if not os.path.exists(os.path.join(args.config, "loom", "config.hpp")):
        sys.exit("build_loom_torch: no loom/config.hpp in %s" % args.config)

    package = os.path.join(args.out, "loom_torch")
    objects_dir = os.path.join(args.out, "objects")
    os.makedirs(package, exist_ok=True)
    os.makedirs(objects_dir, exist_ok=True)
    includes = [os.path.join(root, "torch", "src"), args.config]
    includes += [os.path.join(root, d, "include") for d in
                 ("runtime", "kernels", "backends", "algorithms", "graph", "sim", "parallel")]
    flags = ["-std=c++20", "-O2", "-fPIC", "-fvisibility=hidden", "-DNDEBUG",
             "-DTORCH_API_INCLUDE_EXTENSION_H", "-DTORCH_EXTENSION_NAME=_C",
             '-DLOOM_TORCH_BUILT_AGAINST="%s"' % torch.__version__,
             "-D_GLIBCXX_USE_CXX11_ABI=%d" % int(torch._C._GLIBCXX_USE_CXX11_ABI)]
    flags += ["-I" + d for d in includes]
    flags += ["-isystem" + d for d in cpp_extension.include_paths() + [python_include]]
    sources = sorted(glob.glob(os.path.join(root, "torch", "src", "*.cpp")))
    start = time.time()

    def compile_one(source):
        obj = os.path.join(objects_dir, os.path.basename(source) + ".o")
        run = subprocess.run([compiler, *flags, "-c", source, "-o", obj],
                             capture_output=True, text=True)
        if run.returncode != 0:
            raise RuntimeError("%s:\n%s" % (source, run.stderr[-6000:]))
        return obj

    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        objects = list(pool.map(compile_one, sources))
    torch_lib = os.path.join(os.path.dirname(torch.__file__), "lib")
    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    extension = os.path.join(package, "_C" + suffix)
    link = [compiler, "-shared", *objects, "-o", extension, "-L" + torch_lib, "-lc10", "-ltorch",
            "-ltorch_cpu", "-ltorch_python", "-L" + args.lib, "-l:libloom.so.0",
            "-Wl,-rpath,$ORIGIN:" + torch_lib]
    run = subprocess.run(link, capture_output=True, text=True)
    if run.returncode != 0:
        sys.exit("build_loom_torch: link failed:\n" + run.stderr[-6000:])
    for f in glob.glob(os.path.join(root, "torch", "loom_torch", "*.py")):
        shutil.copy(f, package)
    for f in glob.glob(os.path.join(args.lib, "libloom*.so*")):
        shutil.copy(f, package)
    print("build_loom_torch: %s against torch %s, python %s, %d sources in %.1f s"
          % (extension, torch.__version__, sysconfig.get_python_version(), len(sources),
             time.time() - start))


if __name__ == "__main__":
    main()
