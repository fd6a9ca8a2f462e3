"""Command-line parsing of configuration dataclasses (jsonargparse): ``--config file.yaml`` plus one option
per field, whose ``--help`` text is the field's docstring. Imports nothing else of the workbench, so any layer
can parse its own config."""
from __future__ import annotations

import functools
import stat
import types
import typing
from collections.abc import Hashable
from dataclasses import MISSING, fields
from pathlib import Path

import yaml

#: The folder that holds the ``workbench`` package (the repository root of a checkout, ``site-packages`` of an
#: install): paths under ``workbench/`` (its configs and shipped assets) resolve against it from any directory.
PACKAGE_PARENT = Path(__file__).resolve().parent.parent
#: Options that name outputs: never redirected into the package.
OUTPUT_OPTIONS = ("out_dir", "out", "results_table", "storage")

#: What a path that is not a regular file is, for the refusal of a ``--config`` pointing at it.
_FILE_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
               (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


class _DuplicateKey(yaml.YAMLError):
    """A YAML mapping that sets ``key`` twice (at ``lines``)."""

    def __init__(self, key, lines: tuple[int, int]):
        super().__init__(f"{key!r} set twice")
        self.key, self.lines = key, lines


class _UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing a mapping that repeats a key (``safe_load`` silently keeps the last one).
    Keys a merge (``<<``) brings in may still be overridden, as YAML allows."""

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen: dict = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=True)
                if not isinstance(key, Hashable):      # left to the base loader's own error
                    continue
                line = key_node.start_mark.line + 1
                if key in seen:
                    raise _DuplicateKey(key, (seen[key], line))
                seen[key] = line
        return super().construct_mapping(node, deep)


def package_path(value):
    """``value`` if it names an existing path from the working directory, or is not a relative path under
    ``workbench/``; else the same path under :data:`PACKAGE_PARENT` when that exists (``workbench/configs/x.yaml``,
    ``workbench/assets/tiny``: the README's paths, from any directory). A list is resolved item by item."""
    if isinstance(value, list):
        return [package_path(v) for v in value]
    if not isinstance(value, str) or not value or "://" in value or "\n" in value:
        return value
    p = Path(value)
    parts = [q for q in p.parts if q != "."]
    if p.is_absolute() or not parts or parts[0] != "workbench" or p.exists():
        return value
    there = PACKAGE_PARENT.joinpath(*parts)
    return str(there) if there.exists() else value


def check_config_file(value: str) -> None:
    """Check the file ``--config value`` names before jsonargparse reads it: a regular file (a FIFO, a device or a
    directory is refused without being opened), UTF-8 text, valid YAML, a mapping of ``option: value`` lines with
    no option set twice. A value that names no existing path is left to jsonargparse (it reports a missing file, or
    reads the value as inline YAML).

    Raises a one-line ``ValueError`` naming the file (and the repeated option) and the fix."""
    path = Path(value)
    try:
        mode = path.stat().st_mode
    except (OSError, ValueError):                # no such path, or not a path at all (inline YAML)
        return
    if not stat.S_ISREG(mode):
        kind = next((name for test, name in _FILE_KINDS if test(mode)), "not a regular file")
        raise ValueError(f"config file {path} is {kind}, not a regular file; pass --config a YAML file of "
                         "'option: value' lines")
    try:
        doc = yaml.load(path.read_bytes().decode("utf-8"), Loader=_UniqueKeyLoader)
    except UnicodeDecodeError as e:
        raise ValueError(f"config file {path} is not UTF-8 text (byte {e.start}); save it as UTF-8") from None
    except _DuplicateKey as e:
        raise ValueError(f"config file {path} sets {e.key!r} twice (lines {e.lines[0]} and {e.lines[1]}); keep one "
                         "of them") from None
    except yaml.YAMLError as e:                  # a syntax error (marked with its line) or an unreadable character
        mark = getattr(e, "problem_mark", None)
        problem = getattr(e, "problem", None) or " ".join(str(e).split())
        where = f" at line {mark.line + 1}" if mark else ""
        raise ValueError(f"config file {path} is not valid YAML ({problem}{where}); fix it, or start from one in "
                         "workbench/configs") from None
    if doc is None:
        raise ValueError(f"config file {path} is empty; write 'option: value' lines in it, or drop --config")
    if not isinstance(doc, dict):
        raise ValueError(f"config file {path} holds a YAML {type(doc).__name__}, not a mapping of 'option: value' "
                         "lines; write one option per line")


def _check_config_exists(value: str) -> None:
    """Refuse (one-line ``ValueError``) a ``--config`` that looks like a file name (``.yaml``, ``.yml``, ``.json``)
    but names no file, saying where it was looked for (jsonargparse would read it as inline YAML or say only
    "File does not exist")."""
    if not isinstance(value, str) or "\n" in value or Path(value).exists():
        return
    if Path(value).suffix.lower() in (".yaml", ".yml", ".json"):
        where = [str(Path.cwd())] + ([str(PACKAGE_PARENT)] if Path(value).parts[:1] == ("workbench",) else [])
        raise ValueError(f"config file {value} does not exist (looked in {' and '.join(where)}); give its path from "
                         f"the working directory, or run from the directory that holds it")


@functools.cache
def _config_file_action():
    """jsonargparse's ``ActionConfigFile`` that first runs :func:`check_config_file` on the path it is given."""
    from jsonargparse import ActionConfigFile

    class CheckedConfigFile(ActionConfigFile):
        def __call__(self, parser, cfg, values, option_string=None):
            values = package_path(values)
            _check_config_exists(values)
            check_config_file(values)
            super().__call__(parser, cfg, values, option_string)

    return CheckedConfigFile


def _dataclass_parser(prog: str, cls):
    from jsonargparse import ArgumentParser, set_parsing_settings

    # field docstrings become the --help text of each option (needs docstring-parser)
    set_parsing_settings(docstring_parse_attribute_docstrings=True)
    p = ArgumentParser(prog=prog, description=(cls.__doc__ or "").strip().splitlines()[0], exit_on_error=False)
    p.add_argument("--config", action=_config_file_action(), help="YAML file with any of the options below")
    p.add_class_arguments(cls, as_group=False)
    return p


def _admits_none(hint) -> bool:
    """Whether the type ``hint`` allows ``None`` (``Optional[...]``, ``X | None``, ``Any``, ``Literal[None, ...]``)."""
    if hint is typing.Any or hint is None or hint is type(None):
        return True
    origin = typing.get_origin(hint)
    if origin is typing.Literal:
        return None in typing.get_args(hint)
    return origin in (typing.Union, types.UnionType) and any(_admits_none(a) for a in typing.get_args(hint))


def check_not_null(cls, values: dict) -> None:
    """Check that no field of the dataclass ``cls`` whose type does not allow ``None`` (and whose default is not
    ``None``) is ``None`` in ``values``: a ``null`` in a YAML config, which jsonargparse lets through where it refuses
    the same ``--option null`` on the command line.

    Raises a one-line ``ValueError`` naming the option, its type and its default."""
    hints = typing.get_type_hints(cls)
    for f in fields(cls):
        if f.name in values and values[f.name] is None and f.default is not None \
                and not _admits_none(hints[f.name]):
            default = "" if f.default is MISSING else f" ({f.default!r})"
            kind = str(hints[f.name]).replace("typing.", "").removeprefix("<class '").removesuffix("'>")
            raise ValueError(f"option {f.name} is null, but it must be of type {kind}; set {f.name} to a value, or leave "
                             f"it out for its default{default}")


def expand_bare_flags(argv: list[str], flags) -> list[str]:
    """``argv`` with each bare ``--flag`` of ``flags`` (boolean fields: followed by nothing or by another option)
    written as ``--flag true``, so ``--confirm_run_unsafe_code`` reads as lm-evaluation-harness's bare flag; the flag
    with a value (``--flag false``) is left as it is."""
    out = []
    for i, a in enumerate(argv):
        out.append(a)
        if a.startswith("--") and a[2:] in flags and (i + 1 == len(argv) or str(argv[i + 1]).startswith("-")):
            out.append("true")
    return out


def parse_dataclass(prog: str, cls, argv: list[str]):
    """Parse ``argv`` (``--config file.yaml`` and ``--field value`` options) into a ``cls`` instance. The boolean
    fields ``cls.BARE_FLAGS`` names may also be given bare (:func:`expand_bare_flags`).

    A relative path under ``workbench/`` that does not exist from the working directory, in ``--config`` or in any
    input option (a config's ``drafter: workbench/assets/...``, a default), is read from the installed package
    (:func:`package_path`), so the README's commands work from any directory; output options are left as given.

    Raises jsonargparse's ``ArgumentError`` (a one-line user error) for an unknown option or a bad value, and a
    one-line ``ValueError`` for a config file that is not a regular UTF-8 YAML mapping without repeated options
    (:func:`check_config_file`) or a ``null`` for an option that cannot be ``None`` (:func:`check_not_null`).
    """
    from jsonargparse import ArgumentError

    p = _dataclass_parser(prog, cls)
    argv = expand_bare_flags([str(a) for a in argv], getattr(cls, "BARE_FLAGS", ()))
    try:
        ns = p.parse_args(argv)
    except ArgumentError as e:
        if "is not accepted" not in str(e):
            raise
        raise ValueError(f"{' '.join(str(e).split())} (on the command line or in a --config file); run `{prog} "
                         "--help` for the valid options") from None
    d = ns.as_dict()
    check_not_null(cls, d)
    names = {f.name for f in fields(cls)} - set(OUTPUT_OPTIONS)
    d = {k: package_path(v) if k in names else v for k, v in d.items()}
    return cls(**{k: v for k, v in d.items() if k in {f.name for f in fields(cls)}})


__all__ = ["PACKAGE_PARENT", "check_config_file", "check_not_null", "expand_bare_flags", "package_path",
           "parse_dataclass"]
