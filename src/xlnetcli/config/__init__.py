"""Typed configuration: the schema (schema.py), its checks (checks.py), YAML files and presets (loading.py).

    cfg = load_config("tiny", ["train.lr=1e-3", "model.dropout=0.0"])   # a preset name or a YAML path
    save_config(cfg, out_dir)        # written next to every output as config.yaml

The presets (tiny, base, large; finetune: glue, squad, race; demo: what `make demo` runs) ship in the package
(``config/presets/``).
This module only names what other packages use.
"""

from xlnetcli.config.checks import BatchMaths, batch_maths, check_config, split_num_predict
from xlnetcli.config.loading import (
    CONFIG_VERSION,
    PRESETS,
    config_from_dict,
    config_to_dict,
    dump_config,
    load_config,
    parse_override,
    preset_path,
    replace,
    save_config,
    upgrade_config,
    yaml_load,
)
from xlnetcli.config.schema import (
    OBJECTIVES,
    SECTIONS,
    Config,
    DataConfig,
    FinetuneConfig,
    ModelConfig,
    TokenizerConfig,
    TrainConfig,
)

__all__ = [
    "CONFIG_VERSION",
    "OBJECTIVES",
    "PRESETS",
    "SECTIONS",
    "BatchMaths",
    "Config",
    "DataConfig",
    "FinetuneConfig",
    "ModelConfig",
    "TokenizerConfig",
    "TrainConfig",
    "batch_maths",
    "check_config",
    "config_from_dict",
    "config_to_dict",
    "dump_config",
    "load_config",
    "parse_override",
    "preset_path",
    "replace",
    "save_config",
    "split_num_predict",
    "upgrade_config",
    "yaml_load",
]
