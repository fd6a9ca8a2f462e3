"""The registry of released-diffusion-LM families: the built-in entries (:data:`~.builtin.BUILTIN_FAMILIES`) and any
added with :func:`register_family`, looked up by name or by a checkpoint's ``config.json``."""
from __future__ import annotations

from dataclasses import dataclass

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


@dataclass(frozen=True)
class FamilyChoice:
    """The family a checkpoint folder is opened as, and why.

    Attributes:
        spec: the chosen family.
        reason: why it was chosen (a phrase: the prefix given, the ``model_type``, or the evidence in a shared
            format).
        others: the other families of a format several families share (SDAR and I-DLM); empty when the folder's
            format is one family's, or the family was forced with ``<family>:<folder>``.
        model_type: the config's ``model_type``.
    """

    spec: FamilySpec
    reason: str
    others: tuple[str, ...] = ()
    model_type: str | None = None

    @property
    def guessed(self) -> bool:
        """True when the folder's format is shared and no prefix chose the family."""
        return bool(self.others)

    def families(self) -> str:
        """The families of the folder's format, sorted and comma-separated."""
        return ", ".join(sorted({self.spec.name, *self.others}))

    def line(self, folder) -> str:
        """The one line naming a guessed choice, why, and the prefix that forces each other family."""
        force = "; ".join(f"{o}:{folder} opens it as {o}" for o in self.others)
        return (f"{folder} opened as {self.spec.name}, a guess: {self.families()} share its format (model_type "
                f"{self.model_type}), and {self.reason} points to {self.spec.name}; {force} "
                f"({self.spec.name}:{folder} keeps {self.spec.name} without this note; --strict_family true refuses "
                "a guess)")


def _accepted_types(spec: FamilySpec) -> tuple[str, ...]:
    """The ``model_type`` values a folder may have for ``spec`` to be forced on it (its own, or its format's)."""
    owner = FAMILIES.get(spec.format_of) if spec.format_of else None
    return tuple(spec.model_types) + (tuple(owner.model_types) if owner else ())


def choose_family(raw: dict, where="", name: str | None = None) -> FamilyChoice | None:
    """The family of a checkpoint's raw ``config.json`` dict, and why, or ``None`` for an ordinary causal LM.

    Args:
        raw: the parsed ``config.json``.
        where: the folder, for messages.
        name: a family name given by the user (``--model <family>:<folder>``), which wins over ``model_type``
            when the folder's format is that family's (or the format it ships in).

    Where two families share a format (I-DLM ships in SDAR's), the family with evidence in the config
    (:attr:`FamilySpec.matches`) is chosen, else the format's owner; the choice is then ``guessed``
    (:attr:`FamilyChoice.guessed`): the caller refuses it under ``--strict_family`` (:func:`refuse_guess`) or
    names it in one line (:func:`announce`).

    Raises :class:`~.spec.FamilyError` (one line) for an unknown family name, a family forced on a folder of
    another family's format, a config without ``model_type``, and a ``model_type`` that is not a transformers class
    and not registered but ships remote code (``auto_map``): that checkpoint needs a registered family, and the
    message lists the registered ones and how to add one.
    """
    mtype = raw.get("model_type")
    if name is not None:
        spec = get_family(name)
        if mtype not in _accepted_types(spec):
            owner = next((s.name for s in FAMILIES.values() if mtype in s.model_types), None)
            what = f"a {owner} checkpoint" if owner else "not a released-dLLM checkpoint of a registered family"
            raise FamilyError(f"{name}:{where}: the folder's config.json says model_type {mtype!r} ({what}), but the "
                              f"{name} family opens model_type {' or '.join(map(repr, _accepted_types(spec)))}; "
                              + (f"use {owner}:{where} or drop the prefix" if owner else "drop the prefix"))
        return FamilyChoice(spec, f"the prefix {name}:", model_type=mtype)
    if mtype is None:
        raise FamilyError(f"{where}: config.json has no model_type, so the family cannot be told; add the release's "
                          f"model_type (registered: {', '.join(registered_model_types())}) or force one with "
                          f"<family>:{where} (families: {', '.join(sorted(FAMILIES))})")
    owner = next((s for s in FAMILIES.values() if mtype in s.model_types), None)
    if owner is None:
        if raw.get("auto_map") and not _is_transformers_type(mtype):
            raise FamilyError(f"{where}: model_type {mtype!r} ships only remote code, which the workbench never "
                              f"runs; registered families: {', '.join(registered_model_types())} (add one with "
                              "workbench.model.families.register_family, see docs/models.md)")
        return None
    sharers = [s for s in FAMILIES.values() if s.format_of == owner.name]
    if not sharers:
        return FamilyChoice(owner, f"model_type {mtype}", model_type=mtype)
    for spec in sharers:
        why = spec.matches(raw) if spec.matches is not None else None
        if why:
            return FamilyChoice(spec, why, tuple(s.name for s in [owner, *sharers] if s is not spec), mtype)
    why = owner.matches(raw) if owner.matches is not None else None
    return FamilyChoice(owner, why or f"model_type {mtype}", tuple(s.name for s in sharers), mtype)


def refuse_guess(choice: FamilyChoice | None, folder, strict: bool | None = None) -> None:
    """Raise :class:`~.spec.FamilyError` (one line, naming the prefix of each family) for a guessed family
    (:attr:`FamilyChoice.guessed`) when ``strict`` (default: the process's ``--strict_family``,
    :func:`~workbench.model.loading.strict_family`). Called before anything is loaded."""
    from ..loading import strict_family

    if choice is None or not choice.guessed or not (strict_family() if strict is None else strict):
        return
    others = " or ".join(f"{o}:{folder}" for o in (choice.spec.name, *choice.others))
    raise FamilyError(f"{folder}: {choice.families()} share its format (model_type {choice.model_type}) and "
                      f"config.json does not tell them apart for certain (the guess would be {choice.spec.name}, "
                      f"from {choice.reason}); --strict_family refuses a guess: pass {others}")


def announce(choice: FamilyChoice | None, folder) -> None:
    """Name a guessed family (:attr:`FamilyChoice.guessed`) in one plain line on stderr
    (:func:`~workbench.model.loading.notice`, once per command), after the folder opened; nothing for a family that
    was not guessed."""
    from ..loading import notice

    if choice is not None and choice.guessed:
        notice(choice.line(folder))


def family_of_config(raw: dict, where="", name: str | None = None) -> FamilySpec | None:
    """The :class:`~.spec.FamilySpec` of :func:`choose_family` (``None`` for an ordinary causal LM), without
    naming a guess. Raises as :func:`choose_family` does."""
    choice = choose_family(raw, where, name)
    return None if choice is None else choice.spec


def _is_transformers_type(mtype) -> bool:
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    return isinstance(mtype, str) and mtype in CONFIG_MAPPING


__all__ = ["FAMILIES", "FamilyChoice", "register_family", "registered_model_types", "get_family", "choose_family",
           "refuse_guess", "announce", "family_of_config"]
