"""``quorumlog serve --config FILE``: a node's flags from a TOML file.

Every flag of ``serve`` has a key: its name without the leading dashes
(``node-id = 1``, ``listen = "10.0.0.1:7070"``, ``metrics-listen = "127.0.0.1:9101"``,
``no-quiesce = true``; a repeatable flag takes a list). A flag given on the command line
wins over the file; an unknown key, or a value of the wrong kind, is an error naming
it. examples/deploy/node.toml is a whole example."""

from __future__ import annotations

import argparse
import tomllib
from pathlib import Path
from typing import Any

CONFIG_FLAG = "--config"


def config_path(argv: list[str]) -> str | None:
    """The FILE of ``--config FILE`` (or ``--config=FILE``) in a serve command line."""
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument(CONFIG_FLAG, default=None)
    known, _ = pre.parse_known_args(argv)
    path: str | None = known.config
    return path


def apply_config_file(serve: argparse.ArgumentParser, path: str) -> None:
    """Make the keys of the TOML file at ``path`` the defaults of ``serve``'s flags (so
    the command line still overrides them); flags the file sets are no longer required
    on the command line. Raises ValueError naming the file and key on any problem."""
    try:
        table = tomllib.loads(Path(path).read_text())
    except OSError as exc:
        raise ValueError(f"cannot read config file {path}: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"config file {path} is not valid TOML: {exc}") from None
    actions = {
        opt[2:]: action
        for action in serve._actions
        for opt in action.option_strings
        if opt.startswith("--") and opt not in ("--help", CONFIG_FLAG)
    }
    defaults: dict[str, Any] = {}
    for key, value in table.items():
        action = actions.get(key)
        if action is None:
            known = ", ".join(sorted(actions))
            raise ValueError(f"config file {path}: unknown key {key!r} (the keys: {known})")
        defaults[action.dest] = _value(action, key, value, path)
        action.required = False
    serve.set_defaults(**defaults)


def _value(action: argparse.Action, key: str, value: Any, path: str) -> Any:
    where = f"config file {path}: key {key!r}"
    if isinstance(action, argparse._StoreTrueAction | argparse._StoreFalseAction):
        if not isinstance(value, bool):
            raise ValueError(f"{where} is a switch: true or false, got {value!r}")
        return value if isinstance(action, argparse._StoreTrueAction) else not value
    if isinstance(action, argparse._AppendAction):
        items = value if isinstance(value, list) else [value]
        if not all(isinstance(v, str) for v in items):
            raise ValueError(f"{where} takes a string or a list of strings, got {value!r}")
        return list(items)
    if isinstance(value, bool | list | dict):
        raise ValueError(f"{where} takes one value, got {value!r}")
    if action.type is int:
        if not isinstance(value, int):
            raise ValueError(f"{where} takes an integer, got {value!r}")
        return value
    return str(value)
