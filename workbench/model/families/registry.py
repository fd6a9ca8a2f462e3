"""The registry of released-diffusion-LM families: the built-in entries (:data:`~.builtin.BUILTIN_FAMILIES`) and any
added with :func:`register_family`, looked up by name or by a checkpoint's ``config.json``."""
from __future__ import annotations

from .builtin import BUILTIN_FAMILIES
from .spec import FamilyError, FamilySpec

#: Registered families by name.
FAMILIES: dict[str, FamilySpec] = {}


def register_family(spec: FamilySpec) -> FamilySpec:
    """Add ``spec`` to :data:`FAMILIES`. Raises ``ValueError`` when one of its ``model_types`` already belongs to
    another family (a ``model_type`` resolves to one family)."""
    for other in FAMILIES.values():
        clash = set(other.model_types) & set(spec.model_types)
        if other.name != spec.name and clash:
            raise ValueError(f"family {spec.name}: model_type {sorted(clash)[0]!r} is already {other.name}'s")
    FAMILIES[spec.name] = spec
    return spec


for _spec in BUILTIN_FAMILIES:
    register_family(_spec)


def registered_model_types() -> list[str]:
    """Every ``model_type`` a registered family opens, sorted."""
    return sorted(t for s in FAMILIES.values() for t in s.model_types)


def get_family(name: str) -> FamilySpec:
    """The registered family ``name``; raises :class:`~.spec.FamilyError` listing the registered ones."""
    if name not in FAMILIES:
        raise FamilyError(f"unknown model family {name!r}; registered: {', '.join(sorted(FAMILIES))}")
    return FAMILIES[name]


def family_of_config(raw: dict, where="", name: str | None = None) -> FamilySpec | None:
    """The family of a checkpoint's raw ``config.json`` dict, or ``None`` for an ordinary causal LM.

    Args:
        raw: the parsed ``config.json``.
        where: the folder, for messages.
        name: a family name given by the user (``--model <family>:<folder>``), which wins over ``model_type``.

    Raises :class:`~.spec.FamilyError` (one line) for an unknown family name, and for a ``model_type`` that is not a
    transformers class and not registered but ships remote code (``auto_map``): that checkpoint needs a
    registered family, and the message lists the registered ones and how to add one.
    """
    if name is not None:
        return get_family(name)
    mtype = raw.get("model_type")
    for spec in FAMILIES.values():
        if spec.matches is not None and spec.matches(raw):
            return spec
    for spec in FAMILIES.values():
        if mtype in spec.model_types:
            return spec
    if raw.get("auto_map") and not _is_transformers_type(mtype):
        raise FamilyError(f"{where}: model_type {mtype!r} ships only remote code, which the workbench never runs; "
                          f"registered families: {', '.join(registered_model_types())} (add one with "
                          "workbench.model.families.register_family, see docs/models.md)")
    return None


def _is_transformers_type(mtype) -> bool:
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    return isinstance(mtype, str) and mtype in CONFIG_MAPPING


__all__ = ["FAMILIES", "register_family", "registered_model_types", "get_family", "family_of_config"]
