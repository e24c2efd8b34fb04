"""benchmarks/corpus_scale.py's helpers at a tiny size: the corpus builder, the stage runner's figures, the disk count
and the 1 TB projection (the benchmark itself is run by hand: BENCHMARKS.md)."""

import importlib.util
import sys

import pytest
from clitools import ROOT

SCRIPT = ROOT / "benchmarks" / "corpus_scale.py"
sys.path.insert(0, str(SCRIPT.parent))  # as `python benchmarks/corpus_scale.py` runs it: runner.py beside it
spec = importlib.util.spec_from_file_location("corpus_scale_bench", SCRIPT)
cs = importlib.util.module_from_spec(spec)
spec.loader.exec_module(cs)


def test_corpus_is_deterministic_split_into_files_and_documents(tmp_path):
    a = cs.build_corpus(tmp_path / "a", 0.3, 3)
    b = cs.build_corpus(tmp_path / "b", 0.3, 3)
    assert a["files"] == 3 and a["bytes"] >= 300_000 and a["bytes"] == b["bytes"]
    for name in (f"corpus_{i:03d}.txt" for i in range(3)):
        text = (tmp_path / "a" / name).read_bytes()
        assert text == (tmp_path / "b" / name).read_bytes()
        assert text.endswith(b"\n") and b"\n\n" in text  # documents end with a blank line


def test_disk_counts_allocated_blocks_and_skips_folders(tmp_path):
    (tmp_path / "tokenizer").mkdir()
    (tmp_path / "tokenizer" / "m").write_bytes(b"x" * 100_000)
    with open(tmp_path / "sparse", "wb") as f:
        f.truncate(50_000_000)  # a part's pass file: full shape, holes outside its rows
        f.write(b"y" * 10_000)
    got = cs.disk_bytes(tmp_path, skip=("tokenizer",))
    assert 10_000 <= got < 1_000_000
    assert cs.disk_bytes(tmp_path) >= got + 100_000


def test_run_stage_measures_the_child(tmp_path):
    res = cs.run_stage(["config", "show", "tiny"], tmp_path / "stage", interval=0.05)
    assert res["wall_s"] > 0 and res["cpu_s"] > 0 and res["rss_mb"] > 10
    assert not (tmp_path / "stage" / "tmpdir").exists()
    with pytest.raises(SystemExit, match="failed"):
        cs.run_stage(["config", "show", "no-such-preset"], tmp_path / "bad")


def test_projection_parts_on_n_machines_then_merge_on_one():
    rows = [
        {"stage": "tokenize train", "workers": 2, "mb": 100.0, "wall_s": 50.0, "mb_s": 2.0},
        {"stage": "shard", "workers": 2, "mb": 100.0, "wall_s": 5.0, "mb_s": 20.0},
        {"stage": "shard --part 0/2", "workers": 2, "mb": 40.0, "wall_s": 2.5},
        {"stage": "shard --part 1/2", "workers": 2, "mb": 60.0, "wall_s": 2.5},
        {"stage": "shard merge", "workers": "-", "mb": 100.0, "wall_s": 1.0},
        {"stage": "preprocess", "workers": 2, "mb": 100.0, "wall_s": 10.0, "mb_s": 10.0},
        {"stage": "preprocess --part 0/2", "workers": 2, "mb": 50.0, "wall_s": 5.0},
        {"stage": "preprocess --part 1/2", "workers": 2, "mb": 50.0, "wall_s": 5.0},
        {"stage": "preprocess merge", "workers": "-", "mb": 100.0, "wall_s": 2.0},
    ]
    one, eight = cs.projection({"rows": rows}, [1, 8])
    h = 1e6 / 3600
    assert one["shard_parts_h"] == pytest.approx(h / 20) and one["shard_merge_h"] == 0
    assert eight["shard_parts_h"] == pytest.approx(h / 8 / 20) and eight["shard_merge_h"] == pytest.approx(h / 100)
    assert eight["preprocess_merge_h"] == pytest.approx(h / 50)
    assert eight["total_h"] == pytest.approx(h * (1 / 160 + 1 / 100 + 1 / 80 + 1 / 50))
    assert one["tokenize_whole_tb_h"] == pytest.approx(h / 2)
