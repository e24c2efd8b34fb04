"""benchmarks/ablation.py: each row is a valid config that differs from the full model in exactly its ablation,
and trains on records made with its own settings (what pretrain checks)."""

import importlib.util
import sys

from clitools import ROOT

from xlnetcli.config import config_to_dict, load_config
from xlnetcli.train.pretrain import RECORD_KEYS

SCRIPT = ROOT / "benchmarks" / "ablation.py"
sys.path.insert(0, str(SCRIPT.parent))  # as `python benchmarks/ablation.py` runs it: runner.py beside it
spec = importlib.util.spec_from_file_location("ablation_bench", SCRIPT)
ablation = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = ablation  # dataclasses look their module up
spec.loader.exec_module(ablation)


def flat(cfg) -> dict:
    return {f"{sec}.{k}": v for sec, d in config_to_dict(cfg).items() for k, v in d.items()}


def test_rows_differ_from_the_full_model_in_their_ablation_only():
    full = flat(load_config(ablation.CONFIG, ablation.FULL.sets))
    intended = {
        "dae": {"model.objective": "mlm"},
        "clm": {"model.objective": "clm"},
        "no-memory": {"model.mem_len": 0},
        "no-span": {"data.max_gram": 1},
        "no-bidata": {"model.bi_data": False},
    }
    assert [r.key for r in ablation.ROWS] == ["xlnet", *intended]
    for row in ablation.ROWS[1:]:
        cfg = flat(load_config(ablation.CONFIG, row.sets))
        assert {k: v for k, v in cfg.items() if full[k] != v} == intended[row.key], row.key


def test_each_row_trains_on_records_made_with_its_settings():
    variants = set()
    for row in ablation.ROWS:
        cfg = flat(load_config(ablation.CONFIG, row.sets))
        rec = flat(load_config(ablation.CONFIG, ablation.record_sets(row.sets)))
        assert all(cfg[k] == rec[k] for k in RECORD_KEYS.values()), row.key
        variants.add(ablation.records_name(ablation.record_sets(row.sets)))
    # the objectives and memory share the full model's records; span length and bi_data need their own
    assert len(variants) == 3 and len(variants | {ablation.records_name(ablation.EVAL_SETS)}) == 3


def test_benchmark_overrides_are_checked_before_anything_runs():
    """--set / --finetune-set of the quality benchmarks: KEY=VALUE under the allowed sections, no key that would need
    other records, a value the config accepts; anything else is one line and an exit."""
    import pytest
    from runner import check_sets

    check_sets(["model.n_layer=2", "train.lr=2e-3"], ("model.", "train."), "--set")
    check_sets(["finetune.summary_type=mean"], ("finetune.",), "--finetune-set")
    for bad in (
        "model.bi_data=false",
        "data.seq_len=64",
        "finetune.lr=1e-3",
        "model.n_layer",
        "model.n_layer=two",
        "model.no_such_key=1",
    ):
        with pytest.raises(SystemExit) as e:
            check_sets([bad], ("model.", "train."), "--set")
        assert isinstance(e.value.code, str) and "\n" not in e.value.code and "--set" in e.value.code, bad
