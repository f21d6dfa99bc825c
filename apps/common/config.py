"""Config loading shared by the trainers: a dataclass schema, a YAML preset, key=value overrides.

    cfg = load_config(MoEConfig, ["--config", "configs/moe/tiny.yaml", "train.steps=20"])

The schema is an omegaconf structured config, so an unknown key or a value of the wrong type
is an error. Fields declared with `choice(...)` accept only the listed values. Every error is
a `ConfigError` naming the key and what it accepts, raised before any process starts talking.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from mcr.config import ConfigError  # one ConfigError in the repository: the runtime's and the apps'
from mcr.files import write_atomic as write_atomic  # re-exported: checkpoint and metrics import it from here

from .schema import choice as choice  # re-exported: schemas import it from here (model and data modules from .schema)

USAGE = "usage: python -m apps.<app> [--config PRESET.yaml] [key=value ...]"


def load_config(schema: type, argv: list[str]) -> DictConfig:
    """Schema defaults < preset file (`--config PATH`) < `key=value` overrides, then checked."""
    preset, overrides = _parse_argv(argv)
    layers = [OmegaConf.structured(schema)]
    if preset is not None:
        if not os.path.isfile(preset):
            raise ConfigError(f"--config: no such file {preset!r}")
        layers.append(_guarded(lambda: OmegaConf.load(preset), schema, f"in {preset}"))
    layers.append(_guarded(lambda: OmegaConf.from_dotlist(overrides), schema, "on the command line"))
    cfg = _guarded(lambda: OmegaConf.merge(*layers), schema, f"in {preset}" if preset else "")
    _check_choices(schema, cfg, "")
    return cfg


def _parse_argv(argv):
    preset, overrides = None, []
    it = iter(argv)
    for arg in it:
        if arg == "--config":
            preset = next(it, None)
            if preset is None:
                raise ConfigError("--config needs a file path\n" + USAGE)
        elif arg.startswith("--config="):
            preset = arg.split("=", 1)[1]
        elif "=" in arg and not arg.startswith("-"):
            overrides.append(arg)
        else:
            raise ConfigError(f"unexpected argument {arg!r}; overrides are key=value\n{USAGE}")
    return preset, overrides


def _guarded(make, schema, where):
    try:
        return make()
    except OmegaConfBaseException as exc:
        raise ConfigError(_explain(exc, schema, where)) from None


def _explain(exc, schema, where) -> str:
    key = getattr(exc, "full_key", None) or ""
    where = f" {where}" if where else ""
    first_line = str(exc).splitlines()[0]
    if type(exc).__name__ == "ConfigKeyError" and key:
        parent = key.rsplit(".", 1)[0] if "." in key else ""
        valid = _keys_at(schema, parent)
        scope = f"under {parent!r}" if parent else "at the top level"
        return f"unknown config key {key!r}{where}; valid keys {scope}: {', '.join(valid)}"
    if key:
        return f"bad value for config key {key!r}{where}: {first_line}"
    return f"bad config{where}: {first_line}"


def _keys_at(schema, dotted: str) -> list[str]:
    node = schema
    for part in filter(None, dotted.split(".")):
        value = getattr(node(), part, None)  # the default object knows the nested dataclass
        if not dataclasses.is_dataclass(value):
            return []
        node = type(value)
    return [f.name for f in dataclasses.fields(node)]


def _check_choices(schema, cfg, prefix):
    default = schema()
    for f in dataclasses.fields(schema):
        key = f"{prefix}{f.name}"
        value = cfg[f.name]
        if "choices" in f.metadata and value not in f.metadata["choices"]:
            valid = ", ".join(str(c) for c in f.metadata["choices"])
            raise ConfigError(f"bad value {value!r} for config key {key!r}; choose one of {valid}")
        nested = getattr(default, f.name)
        if dataclasses.is_dataclass(nested):
            _check_choices(type(nested), value, key + ".")


def check(condition: bool, key: str, message: str) -> None:
    """For checks a schema cannot express: `check(k in (1, 2), "model.top_k", "must be 1 or 2")`."""
    if not condition:
        raise ConfigError(f"bad value for config key {key!r}: {message}")


def save_resolved(cfg: DictConfig, path: str) -> None:
    """Write the resolved config as YAML, atomically (a reader never sees half a file)."""
    write_atomic(path, OmegaConf.to_yaml(cfg, resolve=True))


def to_dict(cfg: Any) -> dict:
    return OmegaConf.to_container(cfg, resolve=True)
