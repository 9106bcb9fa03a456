"""What a newcomer's first test run meets: the suite collects without torch (the tests that need it skip,
saying why), and the docs' console blocks run in the caller's venv, with its packages."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# Put first on sys.path, it makes `import torch` fail as on a machine without torch.
NO_TORCH = '''
import sys

class _NoTorch:
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ModuleNotFoundError("No module named 'torch'", name="torch")
        return None

sys.meta_path.insert(0, _NoTorch())
'''


def test_the_suite_collects_without_torch(tmp_path: Path) -> None:
    (tmp_path / "sitecustomize.py").write_text(NO_TORCH)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), str(ROOT)]))
    r = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                        "-rs", str(ROOT / "tests")], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=600)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-3000:]
    assert "error" not in out.splitlines()[-1].lower(), out[-3000:]
    assert "could not import 'torch'" in out          # the torch tests skip and say why


def test_console_blocks_run_in_the_callers_venv(tmp_path: Path) -> None:
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(system_site_packages=True, with_pip=False, symlinks=True).create(env_dir)
    script = textwrap.dedent(f'''
        import subprocess, sys
        sys.path.insert(0, {str(ROOT / "tests" / "package")!r})
        from pathlib import Path
        from test_docs import python_bin
        bindir = python_bin(Path({str(tmp_path)!r}))
        r = subprocess.run([str(bindir / "python"), "-c", "import sys; print(sys.prefix)"],
                           capture_output=True, text=True, check=True)
        print(r.stdout.strip() == sys.prefix, r.stdout.strip(), sys.prefix)
    ''')
    r = subprocess.run([str(env_dir / "bin" / "python"), "-c", script], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("True "), r.stdout
