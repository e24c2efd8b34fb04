"""Reading and writing configs: presets by name, YAML files (safe types, no aliases), ``--set section.key=value``.

    cfg = load_config("tiny", ["train.lr=1e-3", "model.dropout=0.0"])   # a preset name or a YAML path
    save_config(cfg, out_dir)        # written next to every output as config.yaml

Unknown keys, wrong types and values out of range raise ConfigError naming the key, the allowed range and where the
value came from (the file, or the ``--set`` item). The presets ship in the package (``xlnetcli/config/presets/``).

Versions: every config the tool writes starts with ``config_version: 2``. A file without it was written by an earlier
version (or by hand). Read as an output's own config (a run, step, records or shards folder: ``upgrade=True``), an
earlier version's 0 in a cadence key is read in today's spelling (``upgrade_config``), with one line on stderr; in a
file given with --config or a --set item, 0 is refused naming the new spelling.
"""

from __future__ import annotations

import dataclasses
import sys
import typing
from importlib.resources import files
from pathlib import Path
from typing import Any

import yaml

from xlnetcli.config.checks import check_value, coerce
from xlnetcli.config.schema import SECTIONS, Config
from xlnetcli.core.errors import ConfigError
from xlnetcli.core.files import atomic_write_text
from xlnetcli.core.text import clip, printable, short

# Presets shipped in the package (xlnetcli/config/presets/), accepted by name wherever a config file is. Each file
# stands alone (no inheritance): what it says is what a run gets. demo is what `make demo` runs (tiny, 2 layers);
# continue-* continue a pretrained model (`xlnet pretrain --init`) with the architecture of tiny/base/large.
PRESETS = {
    "tiny": "tiny.yaml",
    "base": "base.yaml",
    "large": "large.yaml",
    "glue": "finetune/glue.yaml",
    "squad": "finetune/squad.yaml",
    "race": "finetune/race.yaml",
    "demo": "demo.yaml",
    "continue-tiny": "continue-tiny.yaml",
    "continue-base": "continue-base.yaml",
    "continue-large": "continue-large.yaml",
}


# Written at the top of every config.yaml; 1 = the files before it (no config_version), where 0 in train.eval_every,
# train.save_every, finetune.eval_every, finetune.save_every and finetune.max_steps meant a different thing per section.
CONFIG_VERSION = 2
_UPGRADED: set[str] = set()  # files already announced in this process


# ---- YAML without aliases -------------------------------------------------------------------------------------


class YAMLAliasError(yaml.YAMLError):
    """An alias or anchor in a config: refused, since a few hundred bytes of aliases expand to gigabytes."""


class YAMLDuplicateKeyError(yaml.YAMLError):
    """A key given twice in one mapping: YAML's last one would win silently, so the first is a setting never used."""


class YAMLNestingError(yaml.YAMLError):
    """Nesting deeper than Python's stack (a few thousand ``[``): refused, not a RecursionError traceback."""


class _ConfigLoader(yaml.SafeLoader):
    """SafeLoader that refuses anchors and aliases (the 'billion laughs' expansion; configs never need them) and a
    key given twice in one mapping."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None) is not None:
            raise YAMLAliasError(f"line {event.start_mark.line + 1}")
        return super().compose_node(parent, index)

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:
        seen: dict[tuple[str, str], int] = {}  # (resolved tag, text) of each scalar key: its line
        for key_node, _ in node.value:
            if isinstance(key_node, yaml.ScalarNode) and key_node.tag != "tag:yaml.org,2002:merge":
                key, line = (key_node.tag, key_node.value), key_node.start_mark.line + 1
                if key in seen:
                    raise YAMLDuplicateKeyError(f"key {short(key[1])} is given twice (lines {seen[key]} and {line})")
                seen[key] = line
        return super().construct_mapping(node, deep)


def yaml_load(text: str) -> Any:
    """Parse one YAML document with safe types, no anchors or aliases (YAMLAliasError), no key given twice in a
    mapping (YAMLDuplicateKeyError) and nesting Python's stack can hold (YAMLNestingError)."""
    try:
        return yaml.load(text, Loader=_ConfigLoader)  # a SafeLoader subclass: no arbitrary objects
    except RecursionError:
        raise YAMLNestingError("nested too deeply") from None


# ---- presets and files ----------------------------------------------------------------------------------------


def preset_path(name: str) -> Path:
    """The packaged YAML of a preset name (PRESETS)."""
    if name not in PRESETS:
        raise ConfigError(f"unknown preset {short(name)} (presets: {', '.join(PRESETS)})")
    return Path(str(files("xlnetcli.config").joinpath("presets", *PRESETS[name].split("/"))))


def resolve_config_path(path: str | Path) -> Path:
    """A config argument -> the YAML file it names: an existing file, else a preset name; a one-line error
    otherwise (a folder, or neither a file nor a preset)."""
    p = Path(path)
    if p.is_file():
        return p
    if str(path) in PRESETS:
        return preset_path(str(path))
    names = ", ".join(PRESETS)
    if p.is_dir():
        inner = f" (e.g. {p / 'config.yaml'})" if (p / "config.yaml").is_file() else ""
        raise ConfigError(f"config {p} is a folder; pass a YAML file{inner} or a preset name: {names}")
    if p.exists():  # `--config <(...)`: a pipe or a device, never opened (a FIFO would block; a run reads it again)
        raise ConfigError(f"config {clip(p, 200)} is not a regular file (a pipe or a device); save it to a file")
    raise ConfigError(f"config file not found: {clip(p, 200)} (nor a preset name: {names})")


def _read_yaml(path: str | Path) -> tuple[dict[str, Any], str]:
    """The sections of a config file (or preset) and how to name it in messages."""
    p = resolve_config_path(path)
    where = f"preset {path}" if str(path) in PRESETS and not Path(path).is_file() else str(p)
    try:
        raw = yaml_load(p.read_text(encoding="utf-8")) or {}
    except YAMLAliasError as e:
        raise ConfigError(
            f"{where}: YAML aliases and anchors (*name, &name) are not allowed in configs ({e})"
        ) from None
    except YAMLDuplicateKeyError as e:
        raise ConfigError(f"{where}: {e}; keep one of them") from None
    except YAMLNestingError:
        raise ConfigError(f"{where}: not valid YAML (nested too deeply for a config)") from None
    except (yaml.YAMLError, UnicodeDecodeError) as e:
        line = getattr(getattr(e, "problem_mark", None), "line", None)
        at = f" (line {line + 1})" if line is not None else ""
        raise ConfigError(f"{where}: not valid YAML{at}") from None
    except OSError as e:
        raise ConfigError(f"{where}: cannot read it ({e.strerror or e})") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: the config must be a mapping of sections, got {type(raw).__name__}")
    return raw, where


# ---- sections of keys, overrides ------------------------------------------------------------------------------


def check_key(section: str, key: str, value: Any) -> Any:
    """One ``section.key: value``: the section and key must exist, the value have the field's type and lie in its
    range. Returns the converted value."""
    cls = SECTIONS.get(section)
    if cls is None:
        raise ConfigError(f"unknown section {short(section)} (known: {', '.join(SECTIONS)})")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    if key not in fields:
        raise ConfigError(f"unknown key {section}.{clip(key)} (known: {', '.join(sorted(fields))})")
    name = f"{section}.{key}"
    value = coerce(value, typing.get_type_hints(cls)[key], name)
    check_value(fields[key], value, name)
    return value


def _check_raw(raw: Any) -> dict[str, dict[str, Any]]:
    """Validate every key of nested dicts (sections of keys) on its own; returns them converted."""
    if not isinstance(raw, dict):
        raise ConfigError(f"the config must be a mapping of sections, got {type(raw).__name__}")
    out: dict[str, dict[str, Any]] = {}
    for name, values in raw.items():
        if name not in SECTIONS:
            raise ConfigError(f"unknown section {short(name)} (known: {', '.join(SECTIONS)})")
        if values is None:
            values = {}
        if not isinstance(values, dict):
            raise ConfigError(f"section {name!r} must be a mapping, got {short(values)}")
        out[name] = {key: check_key(name, key, value) for key, value in values.items()}
    return out


def config_version(raw: dict[str, Any]) -> int:
    """The config_version of a config's sections (1: none, an earlier version's); a newer version's is refused."""
    version = raw.get("config_version", 1)
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise ConfigError(f"config_version must be a positive integer, got {short(version)}")
    if version > CONFIG_VERSION:
        raise ConfigError(
            f"written by a newer xlnet (config_version {version}; this one reads up to {CONFIG_VERSION}): "
            "upgrade xlnetcli"
        )
    return version


def upgrade_config(raw: dict[str, Any], where: str) -> dict[str, Any]:
    """The sections of a config an earlier version wrote (config_version < 2), in today's spelling: each 0 in a key
    whose 0 meant the section's special case (schema.steps_or_word) becomes that case's word (finetune.eval_every: 0
    -> epoch, train.save_every: 0 -> end, finetune.max_steps: 0 -> null, ...). Says so in one line on stderr, once per
    file and process. Returns the sections without config_version."""
    version = config_version(raw)
    raw = {k: dict(v) if isinstance(v, dict) else v for k, v in raw.items() if k != "config_version"}
    if version >= CONFIG_VERSION:
        return raw
    changed = []
    for name, values in raw.items():
        if name not in SECTIONS or not isinstance(values, dict):
            continue  # _check_raw names the problem
        for f in dataclasses.fields(SECTIONS[name]):
            v = values.get(f.name)
            if "zero_was" in f.metadata and v == 0 and not isinstance(v, bool):
                values[f.name] = f.metadata["zero_was"]
                changed.append(f"{name}.{f.name}=0 as {'null' if values[f.name] is None else values[f.name]}")
    if changed and where not in _UPGRADED:
        _UPGRADED.add(where)
        from xlnetcli.core.console import is_rank0  # noqa: PLC0415 - rich is heavy: not on every command's start-up

        if is_rank0():
            print(f"xlnet: {where} was written by an earlier version; read {', '.join(changed)}", file=sys.stderr)
    return raw


def config_from_dict(raw: dict[str, Any]) -> Config:
    """Build a validated Config from nested dicts (missing keys take their defaults; a config_version key is
    checked and dropped: ``upgrade_config`` reads an earlier version's)."""
    config_version(raw)
    checked = _check_raw({k: v for k, v in raw.items() if k != "config_version"})
    return Config(**{name: SECTIONS[name](**values) for name, values in checked.items()})


def parse_override(item: str) -> tuple[str, str, Any]:
    """'section.key=value' -> (section, key, parsed value). The value is parsed as YAML (1e-4, true, [1, 2])."""
    if "=" not in item:
        raise ConfigError(f"--set {clip(printable(item))}: expected section.key=value, e.g. train.lr=1e-4")
    path, text = item.split("=", 1)
    parts = path.strip().split(".")
    if len(parts) != 2 or not all(parts):
        raise ConfigError(f"--set {clip(printable(item))}: expected section.key=value, e.g. train.lr=1e-4")
    try:
        value = yaml_load(text) if text.strip() else ""
    except YAMLAliasError:
        raise ConfigError(
            f"--set {clip(printable(item))}: YAML aliases and anchors (*name, &name) are not allowed"
        ) from None
    except (YAMLDuplicateKeyError, YAMLNestingError) as e:
        raise ConfigError(f"--set {clip(printable(item))}: {e}") from None
    except yaml.YAMLError:
        value = text
    return parts[0], parts[1], value


def load_config(
    path: str | Path | None = None,
    overrides: typing.Sequence[str] = (),
    settings: typing.Sequence[tuple[str, str, Any]] = (),
    *,
    upgrade: bool = False,
) -> Config:
    """Load a YAML config or preset name (the defaults when ``path`` is None), apply ``section.key=value``
    overrides, then ``settings``: (source, "section.key", value) from a command's own options, e.g.
    ("--vocab-size 500", "tokenizer.vocab_size", 500). A problem is reported against its source: the file for its
    own keys, the ``--set`` item or option for an override (and for a combination that an override made
    impossible). ``upgrade``: the file is an output's own config.yaml (a run, step, records or shards folder), read
    in today's spelling when an earlier version wrote it (``upgrade_config``); otherwise such a 0 is refused."""
    raw: dict[str, Any] = {}
    where = "the defaults"
    if path is not None:
        raw, where = _read_yaml(path)
    try:
        if upgrade:
            raw = upgrade_config(raw, where)
        else:
            config_version(raw)
            raw = {k: v for k, v in raw.items() if k != "config_version"}
        file_values = _check_raw(raw)
    except ConfigError as e:
        raise ConfigError(f"{where}: {e}") from None
    values = {name: dict(v) for name, v in file_values.items()}
    changes = [(f"--set {clip(printable(item))}", *parse_override(item)) for item in overrides]
    changes += [(source, *dotted.split("."), value) for source, dotted, value in settings]
    applied: list[tuple[str, str]] = []
    for source, section, key, value in changes:
        try:
            value = check_key(section, key, value)
        except ConfigError as e:
            raise ConfigError(f"{source}: {e}") from None
        values.setdefault(section, {})[key] = value
        applied.append((source, f"{section}.{key}"))
    # the two vocabulary sizes must agree: overriding one alone sets the other
    keys = {k for _, k in applied}
    for a, b in (("tokenizer", "model"), ("model", "tokenizer")):
        if f"{a}.vocab_size" in keys and f"{b}.vocab_size" not in keys:
            values.setdefault(b, {})["vocab_size"] = values[a]["vocab_size"]
    try:
        return Config(**{name: SECTIONS[name](**v) for name, v in values.items()})
    except ConfigError as e:
        if applied and _builds(file_values):
            blamed = [source for source, k in applied if k in str(e)] or [source for source, _ in applied]
            src = "" if path is None else f" (with {where})"
            raise ConfigError(f"{clip(' '.join(blamed), 120)}: {e}{src}") from None
        raise ConfigError(f"{where}: {e}") from None


def _builds(values: dict[str, dict[str, Any]]) -> bool:
    try:
        Config(**{name: SECTIONS[name](**v) for name, v in values.items()})
    except ConfigError:
        return False
    return True


def config_to_dict(cfg: Config) -> dict[str, Any]:
    out = {}
    for name in SECTIONS:
        section = dataclasses.asdict(getattr(cfg, name))
        out[name] = {k: list(v) if isinstance(v, tuple) else v for k, v in section.items()}
    return out


def dump_config(cfg: Config) -> str:
    """The YAML of a config as every output keeps it: config_version first, then the sections."""
    return yaml.safe_dump({"config_version": CONFIG_VERSION, **config_to_dict(cfg)}, sort_keys=False)


def save_config(cfg: Config, directory: str | Path, name: str = "config.yaml") -> Path:
    """Write the resolved config next to an output (atomically)."""
    path = Path(directory) / name
    atomic_write_text(path, dump_config(cfg))
    return path


def replace(cfg: Config, **sections: dict[str, Any]) -> Config:
    """A copy of ``cfg`` with some keys changed, re-validated: replace(cfg, model={"dropout": 0.0})."""
    raw = config_to_dict(cfg)
    for name, values in sections.items():
        raw[name].update(values)
    return config_from_dict(raw)
