"""The Python API page runs as written: ``docs/python-api.md``'s ``pycon`` blocks are one doctest, and each
printed value must equal what the page shows, so a changed result fails here. The page's ``wb.<name>`` uses are the
public API, exactly what ``workbench.__all__`` exports; ``import workbench`` stays cheap (its names load lazily)."""
import doctest
import random
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "python-api.md"


def _session() -> str:
    """The page's ``pycon`` blocks, in order, as one doctest text."""
    blocks = re.findall(r"```pycon\n(.*?)```", PAGE.read_text(), flags=re.S)
    assert len(blocks) >= 8, "the page lost its examples"
    return "\n".join(blocks)


def test_the_python_api_page_runs_as_a_doctest(tmp_path, monkeypatch):
    """Every example of the page, in fp32 on one thread (as the page says its outputs were made), from a fresh
    working folder (its temporary folders inside the test's); random states, the thread count and the environment
    (Lightning's seed variable) are restored afterwards."""
    import os
    import tempfile

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setenv("WORKBENCH_NATIVE_BF16", "0")
    environ = dict(os.environ)
    threads, rng = torch.get_num_threads(), (torch.get_rng_state(), np.random.get_state(), random.getstate())
    torch.set_num_threads(1)
    try:
        test = doctest.DocTestParser().get_doctest(_session(), {}, "python-api.md", str(PAGE), 0)
        runner = doctest.DocTestRunner(optionflags=doctest.NORMALIZE_WHITESPACE | doctest.ELLIPSIS)
        report = []
        runner.run(test, out=report.append)
    finally:
        for k in set(os.environ) - set(environ):          # e.g. PL_GLOBAL_SEED, set by the collection
            del os.environ[k]
        torch.set_num_threads(threads)
        torch.set_rng_state(rng[0])
        np.random.set_state(rng[1])
        random.setstate(rng[2])
    assert runner.failures == 0, "".join(report)[-6000:]
    assert runner.tries >= 30


def test_the_public_api_is_what_the_page_uses():
    import workbench

    used = set(re.findall(r"\bwb\.([A-Za-z_]\w*)", _session()))
    assert used == set(workbench.__all__), (sorted(used - set(workbench.__all__)),
                                            sorted(set(workbench.__all__) - used))
    for name in workbench.__all__:
        obj = getattr(workbench, name)
        assert obj.__doc__, name                              # each public name is documented where it lives
    assert "load_model" in dir(workbench)


def test_importing_workbench_stays_cheap():
    """``import workbench`` imports none of the heavy libraries nor the modules of its public names (the doctest
    above uses each name, which imports its module on first access); an unknown name is an AttributeError."""
    code = ("import sys, workbench; print([m for m in ('torch', 'transformers', 'pandas', 'zarr', "
            "'workbench.decoding.registry') if m in sys.modules]); print(hasattr(workbench, 'no_such_name'))")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.split("\n")[:2] == ["[]", "False"], res.stdout
