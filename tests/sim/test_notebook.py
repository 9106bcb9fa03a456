"""Executes examples/hit_rates.ipynb (the state-pool sweep, every policy
beside the upper bound, which the notebook checks no replay passes) end to
end.

Skipped when nbclient, ipykernel or matplotlib is not installed, or when the
package has no replay engine; CI installs all three.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOK = ROOT / "examples" / "hit_rates.ipynb"


def test_hit_rates_notebook_runs():
    for module in ("nbclient", "nbformat", "ipykernel", "matplotlib"):
        pytest.importorskip(module)
    if importlib.util.find_spec("mambaradix.sim.engine") is None:
        pytest.skip("mambaradix.sim.engine is not part of this build")
    if os.environ.get("MAMBARADIX_UNDER_ASAN"):
        pytest.skip("the notebook kernel is a separate process; not run under the sanitizers")
    import nbclient
    import nbformat

    nb = nbformat.read(NOTEBOOK, as_version=4)
    # The kernel imports mambaradix from this checkout.
    env_path = os.environ.get("PYTHONPATH", "")
    os.environ["PYTHONPATH"] = str(ROOT) + (os.pathsep + env_path if env_path else "")
    try:
        client = nbclient.NotebookClient(nb, timeout=300, kernel_name="python3",
                                         resources={"metadata": {"path": str(ROOT)}})
        client.execute()  # (nbclient's timeout bounds each cell; no wall-clock assertion here)
    finally:
        if env_path:
            os.environ["PYTHONPATH"] = env_path
        else:
            os.environ.pop("PYTHONPATH", None)
    outputs = "".join(
        o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
        if o.get("output_type") == "stream")
    assert "multi-turn chat: 12 replays" in outputs
    assert "Mooncake conversation: 12 replays" in outputs
    assert "multi-turn chat: 18 more replays" in outputs
    assert "Mooncake conversation: 18 more replays" in outputs
    assert "never used" in outputs and "replay distance" in outputs
    # the upper bound beside the policies: unlimited-pool with 6 running, pool-aware one at a time
    assert outputs.count("(unlimited_pool, ") == 2
    assert "served one at a time: 20 replays with their bounds" in outputs
    assert outputs.count("(pool_aware), best policy") == 5
    assert "notebook ran in" in outputs
    images = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
              if "image/png" in o.get("data", {})]
    assert len(images) == 3
