#!/usr/bin/env python3
"""The loom_torch package as a user gets it: built against this torch, installed (no
PYTHONPATH, not the source tree) when --expect-installed 1, with the transports this machine's
build has (--expect-transports: mpi where Open MPI is, ucx where UCX is), and refusing another
torch at import with an error naming both versions."""
import argparse
import os
import subprocess
import sys


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--expect-installed", default="0")
    ap.add_argument("--expect-transports", default="", help="e.g. mpi,ucx")
    args = ap.parse_args()
    import torch
    import loom_torch
    where = os.path.realpath(loom_torch.__file__)
    print("loom_torch from", where, "built against torch", loom_torch._C.TORCH_VERSION)
    assert loom_torch._C.TORCH_VERSION == torch.__version__, (loom_torch._C.TORCH_VERSION,
                                                              torch.__version__)
    expected_transports = [t for t in args.expect_transports.split(",") if t]
    print("transports", loom_torch.transports())
    assert loom_torch.transports() == expected_transports, (loom_torch.transports(),
                                                            expected_transports)
    if args.expect_installed in ("1", "ON", "TRUE", "true"):
        assert "PYTHONPATH" not in os.environ, "the installed package needs no PYTHONPATH"
        assert "site-packages" in where, "loom_torch should come from the environment: " + where
    # Another torch (its version string changed before loom_torch loads): refused, both named.
    probe = ("import torch; torch.__version__ = '2.99.0+other'\n"
             "try:\n    import loom_torch\nexcept ImportError as e:\n    print(e)\n"
             "else:\n    print('imported')\n")
    out = subprocess.run([sys.executable, "-c", probe], stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True, timeout=60).stdout
    print(out.strip())
    expected = ("loom_torch was built against torch %s but this environment has torch 2.99.0+other"
                % torch.__version__)
    assert expected in out and "pip install --no-build-isolation" in out, out
    print("ok")


if __name__ == "__main__":
    main()
