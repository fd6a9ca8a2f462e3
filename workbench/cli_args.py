"""Command-line parsing of configuration dataclasses (jsonargparse): ``--config file.yaml`` plus one option
per field, whose ``--help`` text is the field's docstring. Imports nothing else of the workbench, so any layer
can parse its own config."""
from __future__ import annotations

from dataclasses import fields


def _dataclass_parser(prog: str, cls):
    from jsonargparse import ActionConfigFile, ArgumentParser, set_parsing_settings

    # field docstrings become the --help text of each option (needs docstring-parser)
    set_parsing_settings(docstring_parse_attribute_docstrings=True)
    p = ArgumentParser(prog=prog, description=(cls.__doc__ or "").strip().splitlines()[0], exit_on_error=False)
    p.add_argument("--config", action=ActionConfigFile, help="YAML file with any of the options below")
    p.add_class_arguments(cls, as_group=False)
    return p


def parse_dataclass(prog: str, cls, argv: list[str]):
    """Parse ``argv`` (``--config file.yaml`` and ``--field value`` options) into a ``cls`` instance.

    Raises jsonargparse's ``ArgumentError`` (a one-line user error) for an unknown option or a bad value.
    """
    p = _dataclass_parser(prog, cls)
    ns = p.parse_args(argv)
    d = ns.as_dict()
    names = {f.name for f in fields(cls)}
    return cls(**{k: v for k, v in d.items() if k in names})


__all__ = ["parse_dataclass"]
