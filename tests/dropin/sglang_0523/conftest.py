"""Collected only in the subprocess that tests/dropin/test_sglang_unified.py starts
(MAMBARADIX_SGL0523_RUN=1), where SGLang 0.5.23 replaces the shared 0.5.15."""

import os
import sys

collect_ignore = ["stubs", "sgl_env.py"]
if os.environ.get("MAMBARADIX_SGL0523_RUN") != "1":
    collect_ignore_glob = ["*"]
else:
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import sgl_env

    sgl_env.bootstrap()
