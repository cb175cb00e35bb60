"""Options as users write them: command-line flags, TOML files and keyword arguments.

One flag per field of `TrainConfig`'s sections, named as before sections existed
(`--sync-every`); the argparse flags and the accepted TOML keys are derived from the
dataclasses, so an option cannot exist in one place and be missing from the other. A TOML
file may name options flat (`sync_every = 20`, as the flags) or in sections
(`[sync]` then `every = 20`, as the fields), or both.
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, get_args, get_origin

from shadowsync.config.plain import plain
from shadowsync.config.sections import HELP_ORDER, HELP_TOPICS, SECTIONS, choices_of, type_hints
from shadowsync.config.train import FLAT, TrainConfig, flag_name, unknown_option
from shadowsync.errors import UserError
from shadowsync.toml_file import read_toml


@dataclass(frozen=True)
class Option:
    """One command-line option: its flat name, and the field it fills."""

    name: str  # flat, with underscores: "sync_every"
    section: str | None  # None: a field of TrainConfig itself (task, seed)
    field: dataclasses.Field

    @property
    def owner(self) -> type:
        return TrainConfig if self.section is None else SECTIONS[self.section]

    @property
    def type(self) -> object:
        return type_hints(self.owner)[self.field.name]

    @property
    def topic(self) -> str | None:
        return self.field.metadata.get("group") or (HELP_TOPICS[self.section]
                                                    if self.section else None)


def _options() -> list[Option]:
    top = {f.name: f for f in dataclasses.fields(TrainConfig)}
    found = [Option("task", None, top["task"])]
    for section, cls in SECTIONS.items():
        found += [Option(flag_name(f), section, f) for f in dataclasses.fields(cls)]
        if section == "data":
            found.append(Option("seed", None, top["seed"]))
    assert {o.name for o in found} == set(FLAT)
    return found


OPTIONS: list[Option] = _options()
BY_NAME = {o.name: o for o in OPTIONS}


def _flag(name: str) -> str:
    return name.replace("_", "-")


def _base_type(tp: object) -> object:
    if get_origin(tp) is Literal:
        return type(get_args(tp)[0])
    args = [a for a in get_args(tp) if a is not type(None)]
    return _base_type(args[0]) if get_origin(tp) is not list and args else tp


def _default_text(o: Option) -> str:
    f = o.field
    value = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
    if value is None or "default" in (f.metadata.get("help") or ""):
        return ""  # the help text says what None means
    value = plain(value)
    if isinstance(value, list):
        value = ",".join(map(str, value)) if f.metadata.get("parse") else " ".join(map(str, value))
    elif isinstance(value, bool):
        value = f"--{'' if value else 'no-'}{_flag(o.name)}"
    return f" (default: {'none' if value == '' else value})"


def add_config_arguments(parser: argparse.ArgumentParser) -> None:
    """One flag per option, grouped by topic; every default is None so the TOML file can fill
    the gaps (--help shows the real defaults)."""
    parser.add_argument("--config", metavar="FILE.toml", help="read options from a TOML file")
    groups = {title: parser.add_argument_group(title) for title in HELP_ORDER}
    for o in OPTIONS:
        group: argparse._ActionsContainer = groups[o.topic] if o.topic else parser
        tp = _base_type(o.type)
        text = (o.field.metadata.get("help") or "") + _default_text(o)
        # argparse %-formats help texts: a literal % (as in start=25%) is written %%.
        kw: dict[str, object] = {"default": None, "dest": o.name, "help": text.replace("%", "%%")}
        if o.field.metadata.get("spec"):  # parsed with the rest of the configuration
            choices = o.field.metadata.get("choices")
            kw.update(type=str, **({"choices": choices} if choices else {"metavar": "TEXT"}))
            if get_origin(tp) is list:
                kw.update(nargs="+", metavar="VALUE")
        elif tp is bool:
            kw["action"] = argparse.BooleanOptionalAction
        elif o.field.metadata.get("parse"):
            kw.update(type=o.field.metadata["parse"], metavar="N[,N...]")
        elif get_origin(tp) is list:
            item = get_args(tp)[0]
            kw.update(type=item, nargs="+", metavar="N" if item is int else "VALUE")
        else:
            choices = choices_of(o.owner, o.field)
            kw.update(type=tp, choices=choices)
            if not choices:
                kw["metavar"] = {int: "N", float: "X"}.get(tp, "TEXT")
        if o.name == "log_level":
            group.add_argument("-q", "--quiet", dest="log_level", action="store_const",
                               const="warning", help="print only the summary and errors")
            group.add_argument("-v", "--verbose", dest="log_level", action="store_const",
                               const="debug", help="print debugging messages too")
        group.add_argument(f"--{_flag(o.name)}", **kw)


def _coerce(name: str, value: object, option: Option, source: str) -> object:
    base = _base_type(option.type)
    if value is None:
        return None
    if option.field.metadata.get("spec"):  # the text, parsed with the rest of the configuration
        items = value if get_origin(base) is list and isinstance(value, list) else [value]
        if any(isinstance(v, bool) or not isinstance(v, (str, int, float)) for v in items):
            raise UserError(f"{source}: option '{name}' must be text, got {value!r}")
        texts = [str(v) for v in items]
        return texts if get_origin(base) is list else texts[0]
    if get_origin(base) is list:
        item = get_args(base)[0]
        if isinstance(value, item) and not isinstance(value, bool):
            value = [value]  # table_size = 100000: one size for every table
        if not isinstance(value, list) or not all(isinstance(v, item) for v in value):
            raise UserError(f"{source}: option '{name}' must be a list of {item.__name__}")
        return value
    if base is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if base is str and isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)  # e.g. sync_interval = 0.5
    if not isinstance(value, base) or (base is int and isinstance(value, bool)):
        raise UserError(f"{source}: option '{name}' must be {base.__name__}, got {value!r}")
    return value


def flat_options(table: dict[str, object], source: str) -> dict[str, object]:
    """A TOML table's options by flat name. Keys are flat option names (`sync_every`, dashes
    allowed) or section tables of field names (`[sync]` `every = 20`)."""
    values: dict[str, object] = {}
    for key, value in table.items():
        name = key.replace("-", "_")
        if name in SECTIONS and isinstance(value, dict):
            fields = {f.name: f for f in dataclasses.fields(SECTIONS[name])}
            for inner, v in value.items():
                f = fields.get(inner.replace("-", "_"))
                if f is None:
                    known = {f"{name}.{n}" for n in fields}
                    raise UserError(f"{source}: {unknown_option(f'{name}.{inner}', known)}")
                option = BY_NAME[flag_name(f)]
                values[option.name] = _coerce(f"{name}.{inner}", v, option, source)
        elif name in BY_NAME:
            values[name] = _coerce(key, value, BY_NAME[name], source)
        else:
            known = set(BY_NAME) | (set(SECTIONS) if isinstance(value, dict) else set())
            raise UserError(f"{source}: {unknown_option(key, known)}")
    return values


def load_config(args: argparse.Namespace, absent: dict[str, object] | None = None) -> TrainConfig:
    """Defaults < `absent` (flat values for options the TOML file does not set) < TOML file
    (`--config`) < command line. Unknown TOML keys are an error."""
    values: dict[str, object] = dict(absent or {})
    path = getattr(args, "config", None)
    if path:
        values.update(flat_options(read_toml(path, path), path))
    for name in BY_NAME:
        v = getattr(args, name, None)
        if v is not None:
            values[name] = v
    return TrainConfig(**values)  # validated on construction


def config_from_options(config: TrainConfig | None = None, **options: object) -> TrainConfig:
    """A validated TrainConfig from a base config (default: all defaults) and keyword options
    named like the long command-line options (`trainers=2, sync="s-bmuf"`), or whole
    sections (`sync=SyncConfig(...)`)."""
    if config is not None and not isinstance(config, TrainConfig):
        raise TypeError(f"config must be a TrainConfig, got {type(config).__name__}")
    for key in options:
        if key not in BY_NAME and key not in SECTIONS:
            raise UserError(unknown_option(key, set(BY_NAME)))
    return dataclasses.replace(config or TrainConfig(), **options)


def default_out_dir() -> Path:
    return Path("runs") / time.strftime("%Y%m%d-%H%M%S")


# The configuration's own writers as functions, for code that maps them over configurations.
config_to_dict = TrainConfig.to_dict
config_to_toml = TrainConfig.to_toml
