"""Issue #35: foreign weights with NaN or inf. A Hugging Face directory whose weights hold a NaN or an infinity is
refused when it is loaded, as our own checkpoints are, in one line naming the tensor and the weights file: `probe`
printed an accuracy for all-NaN features, `eval` exited 0 with a null loss, and `import` wrote a checkpoint every
later load refused with a message about a diverged run. Nothing is written, the directory stays byte-identical."""

from __future__ import annotations

import math

import pytest
import torch
from clitools import FAST_PRETRAIN, TRAIN_TSV, VALID_TSV, assert_one_line_error, run_main
from conftest import tree_digest
from finetunetools import random_init_checkpoint
from safetensors.torch import load_file, save_file

from xlnetcli.checkpoint.hf_dir import load_hf_dir
from xlnetcli.core.errors import CheckpointError

TENSOR = "transformer.layer.1.ff.layer_1.weight"


@pytest.fixture(scope="module")
def hf_dirs(builds, tmp_path_factory):
    """nan/ (an export of a random-init checkpoint, one weight NaN) and inf/ (the same as pytorch_model.bin, one
    weight +inf)."""
    import shutil

    from xlnetcli.interop.huggingface import export_hf

    root = random_init_checkpoint(builds, tmp_path_factory.mktemp("nonfinite"))
    export_hf(root / "init", root / "hf")
    weights = load_file(str(root / "hf" / "model.safetensors"))
    assert TENSOR in weights
    shutil.copytree(root / "hf", root / "nan")
    weights[TENSOR][0, 0] = math.nan
    save_file(weights, str(root / "nan" / "model.safetensors"))
    shutil.copytree(root / "hf", root / "inf")
    (root / "inf" / "model.safetensors").unlink()
    weights[TENSOR][0, 0] = math.inf
    torch.save(weights, root / "inf" / "pytorch_model.bin")
    (root / "out").mkdir()
    return root


@pytest.fixture(autouse=True)
def _no_progress(monkeypatch):
    monkeypatch.setenv("XLNET_NO_PROGRESS", "1")


def test_loading_names_the_tensor_and_the_file(hf_dirs):
    load_hf_dir(hf_dirs / "hf")  # the export itself loads
    with pytest.raises(CheckpointError, match=rf"nan/model\.safetensors: non-finite values \(NaN/inf\) in {TENSOR};"):
        load_hf_dir(hf_dirs / "nan")
    with pytest.raises(CheckpointError, match=rf"inf/pytorch_model\.bin: non-finite .* in {TENSOR};"):
        load_hf_dir(hf_dirs / "inf")


@pytest.mark.parametrize("kind", ["nan", "inf"])
@pytest.mark.parametrize("command", ["import", "eval", "probe"])
def test_every_command_refuses_non_finite_foreign_weights(builds, hf_dirs, kind, command, capsys):
    src, out = hf_dirs / kind, hf_dirs / "out" / f"{command}-{kind}"
    args = {
        "import": ["import", "--from-hf", src, "--out", out],
        "eval": ["eval", src, "--data", builds.pipeline(FAST_PRETRAIN).records, "--output", out],
        "probe": ["probe", src, "--train", TRAIN_TSV, "--valid", VALID_TSV, "--output", out],
    }[command]
    before = tree_digest(hf_dirs)
    code, _, err = run_main(capsys, *args)
    weights = "model.safetensors" if kind == "nan" else "pytorch_model.bin"
    assert_one_line_error(code, err, str(src / weights), TENSOR, "NaN/inf")
    assert "diverged" not in err  # not our run: no advice about an earlier step folder
    assert tree_digest(hf_dirs) == before and not out.exists()
