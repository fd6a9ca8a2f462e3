"""The package has no import cycle: the import-linter layers contract in pyproject.toml holds
(docs/architecture.md). A new import from a lower layer into a higher one fails this test."""
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_import_layers_contract_is_kept():
    exe = shutil.which("lint-imports", path=str(Path(sys.executable).parent)) or shutil.which("lint-imports")
    assert exe, "import-linter is not installed (it is a dev dependency: pip install -e '.[dev]')"
    r = subprocess.run([exe, "--config", str(REPO / "pyproject.toml")], cwd=REPO, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    assert "1 kept, 0 broken" in r.stdout


def test_core_decoding_finds_decoders_of_higher_packages_without_importing_them():
    from workbench.decoding.registry import DECODERS, load_decoders

    load_decoders()
    assert {"ar_greedy", "confidence", "serial", "sampler", "ss_linear", "ss_quadratic", "deer"} <= set(DECODERS)
