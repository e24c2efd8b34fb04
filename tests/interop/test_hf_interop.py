"""HF interop: `xlnet export --format hf` loads in transformers (model + XLNetTokenizer) with identical outputs,
`xlnet import --from-hf` gives our checkpoint back, both round trips are bit-exact; checkpoint errors; Python API."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import torch
from clitools import SAMPLE, TINY, settings_config

from xlnetcli import api
from xlnetcli.checkpoint.folders import save_model_dir, step_dir_name
from xlnetcli.checkpoint.load import load_lm_model, load_model_dir, resolve_checkpoint
from xlnetcli.cli import main
from xlnetcli.config import ModelConfig, config_from_dict
from xlnetcli.core.errors import CheckpointError
from xlnetcli.core.files import sha256_file
from xlnetcli.model import XLNetLMHeadModel
from xlnetcli.model.state_dict_adapter import mems_to_hf

transformers = pytest.importorskip("transformers")


def cli(*args) -> int:
    try:
        main(list(args))
    except SystemExit as e:
        return int(e.code or 0)
    return 0


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory):
    from xlnetcli.data.tokenizer import train_tokenizer

    out = tmp_path_factory.mktemp("tok") / "tokenizer"
    train_tokenizer(settings_config("tokenizer", vocab_size=400, threads=1), [SAMPLE], out, quiet=True)
    return out


def make_cfg(vocab: int):
    return config_from_dict(
        {
            "tokenizer": {"vocab_size": vocab},
            "model": dict(
                vocab_size=vocab,
                d_model=32,
                n_layer=2,
                n_head=4,
                d_head=8,
                d_inner=64,
                dropout=0.0,
                dropatt=0.0,
                mem_len=12,
                reuse_len=8,
                bi_data=False,
            ),
            "data": {"seq_len": 16, "perm_size": 8, "num_predict": 3},
            "train": {"micro_batch_size": 2, "global_batch_size": 2},
        }
    )


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory, tok_dir):
    cfg = make_cfg(400)
    torch.manual_seed(0)
    model = XLNetLMHeadModel(cfg.model)
    with torch.no_grad():
        model.lm_bias.normal_(0, 0.1)
    run = tmp_path_factory.mktemp("run")
    save_model_dir(run / step_dir_name(5), model, cfg, tokenizer_dir=tok_dir, meta={"kind": "pretrain", "step": 5})
    save_model_dir(run / step_dir_name(10), model, cfg, tokenizer_dir=tok_dir, meta={"kind": "pretrain", "step": 10})
    return run


def batch(B=2, L=16, P=3, V=400, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(9, V, (B, L), generator=g)
    tt = torch.zeros(B, L, dtype=torch.long)
    tt[:, 10:] = 1
    tt[:, -1] = 2
    perm = (torch.rand(B, L, L, generator=g) > 0.5).float()
    tidx = torch.stack([torch.randperm(L, generator=g)[:P].sort().values for _ in range(B)])
    tmap = torch.nn.functional.one_hot(tidx, L).float()
    return ids, tt, perm, tmap


def test_resolve_checkpoint_picks_latest(ckpt):
    assert resolve_checkpoint(ckpt).name == "step_0000010"
    cfg, _state, meta = load_model_dir(ckpt)
    assert meta["step"] == 10 and cfg.model.d_model == 32
    assert (resolve_checkpoint(ckpt) / "tokenizer" / "spiece.model").is_file()


@pytest.mark.slow
def test_export_loads_in_transformers_with_identical_outputs(ckpt, tmp_path):
    out = tmp_path / "hf"
    assert cli("export", str(ckpt), "--format", "hf", "--out", str(out)) == 0
    assert {"config.json", "model.safetensors", "spiece.model"} <= {p.name for p in out.iterdir()}
    hf = transformers.XLNetLMHeadModel.from_pretrained(out).eval()
    ours, _, _ = load_lm_model(ckpt)
    ids, tt, perm, tmap = batch()
    with torch.no_grad():
        h = hf(ids, token_type_ids=tt, perm_mask=perm, target_mapping=tmap, use_mems=True)
        o = ours(ids, tt, None, perm, target_mapping=tmap)
        assert torch.allclose(o.logits, h.logits, atol=1e-5, rtol=0)
        # memory: the export's config has none of its own (inference settings); ours, passed in, gives the same
        h2 = hf(ids, token_type_ids=tt, perm_mask=perm, target_mapping=tmap, mems=mems_to_hf(o.mems), use_mems=True)
        o2 = ours(ids, tt, None, perm, target_mapping=tmap, mems=o.mems)
        assert torch.allclose(o2.logits, h2.logits, atol=1e-5, rtol=0)
    hc = json.loads((out / "config.json").read_text())
    assert hc["mem_len"] is None and hc["reuse_len"] is None and hc["bi_data"] is False
    saved = json.loads((out / "xlnet_pretraining.json").read_text())
    assert saved["model"]["mem_len"] == 12 and saved["model"]["reuse_len"] == 8

    # the tokenizer loads unmodified and splits text as ours does
    from xlnetcli.data.tokenizer import Tokenizer

    hf_tok = transformers.XLNetTokenizer.from_pretrained(out)
    ours_tok = Tokenizer.load(resolve_checkpoint(ckpt) / "tokenizer")
    text = "The module provides functions for working with files and directories."
    enc = hf_tok(text)["input_ids"]
    assert enc[-2:] == [4, 3]  # <sep> <cls> appended, as XLNet expects
    assert enc[:-2] == ours_tok.encode_ids(text)


@pytest.mark.slow
def test_export_of_a_real_pretraining_run_gives_our_logits_in_transformers(builds, tmp_path):
    """configs/tiny.yaml as shipped (bi_data on, memory 96, reuse 64; a 1000-piece vocabulary for the small test
    corpus), pretrained for 3 steps, exported: transformers gives our logits for batches of 1, 2 and 3, with and
    without an attention mask (left padding, as XLNet pads)."""
    from xlnetcli.config import load_config
    from xlnetcli.train.pretrain import pretrain

    over = [
        "tokenizer.vocab_size=1000",
        "model.vocab_size=1000",
        "train.max_steps=3",
        "train.eval_every=never",
        "train.save_every=end",
        "train.warmup_steps=1",
    ]
    cfg = load_config(TINY, over)
    assert cfg.model.bi_data and cfg.model.mem_len == 96 and cfg.model.reuse_len == 64
    rec = builds.pipeline(over).records
    pretrain(cfg, rec, tmp_path / "run", quiet=True)
    assert cli("export", str(tmp_path / "run"), "--out", str(tmp_path / "hf")) == 0
    hf = transformers.XLNetLMHeadModel.from_pretrained(tmp_path / "hf").eval()
    ours = api.load(tmp_path / "run")
    g = torch.Generator().manual_seed(0)
    for B in (1, 2, 3):
        ids = torch.randint(9, 1000, (B, 24), generator=g)
        ids[:, -2:] = torch.tensor([4, 3])  # <sep> <cls>
        am = torch.ones(B, 24, dtype=torch.long)
        am[B - 1, :5] = 0  # the last row is left-padded
        ids[B - 1, :5] = 5
        for mask in (None, am):
            o = ours(ids, attention_mask=mask)
            with torch.no_grad():
                h = hf(ids, attention_mask=mask)
            assert h.logits.shape == o.logits.shape == (B, 24, 1000)
            assert torch.allclose(o.logits, h.logits, atol=1e-4, rtol=0), (B, mask is not None)
    # identical rows give identical logits (bi_data would have split the batch)
    with torch.no_grad():
        twice = hf(ids[:1].repeat(2, 1)).logits
    assert torch.allclose(twice[0], twice[1], atol=1e-6)
    # the pretraining layout travels beside config.json and comes back with `xlnet import`
    assert cli("import", "--from-hf", str(tmp_path / "hf"), "--out", str(tmp_path / "back")) == 0
    back, _, _ = load_model_dir(tmp_path / "back")
    assert (back.model.bi_data, back.model.mem_len, back.model.reuse_len) == (True, 96, 64)


@pytest.mark.slow
def test_round_trips_are_bit_exact(ckpt, tmp_path):
    hf_dir, back = tmp_path / "hf", tmp_path / "back"
    assert cli("export", str(ckpt), "--out", str(hf_dir)) == 0
    assert cli("import", "--from-hf", str(hf_dir), "--out", str(back)) == 0
    cfg0, s0, _ = load_model_dir(ckpt)
    cfg1, s1, meta = load_model_dir(back)
    assert meta["kind"] == "import"
    assert s0.keys() == s1.keys()
    for k in s0:
        assert torch.equal(s0[k], s1[k]), k
    for key in (
        "vocab_size",
        "d_model",
        "n_layer",
        "n_head",
        "d_head",
        "d_inner",
        "ff_activation",
        "untie_r",
        "mem_len",
        "reuse_len",
        "bi_data",
        "clamp_len",
        "layer_norm_eps",
    ):
        assert getattr(cfg0.model, key) == getattr(cfg1.model, key), key
    # HF -> ours -> HF: identical tensors
    from safetensors.torch import load_file

    hf2 = tmp_path / "hf2"
    assert cli("export", str(back), "--out", str(hf2)) == 0
    a, b = load_file(str(hf_dir / "model.safetensors")), load_file(str(hf2 / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert (hf_dir / "spiece.model").read_bytes() == (hf2 / "spiece.model").read_bytes()


@pytest.mark.slow
@pytest.mark.parametrize("objective", ["mlm", "clm"])
def test_objective_round_trips(tok_dir, tmp_path, objective):
    """A model pretrained with another objective exports (transformers loads it as any XLNet) and imports back with
    its objective: the content-stream MLM head reads the same rows again. A bad value in the record is one error."""
    cfg = make_cfg(400)
    cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, objective=objective))
    torch.manual_seed(0)
    model = XLNetLMHeadModel(cfg.model).eval()
    save_model_dir(tmp_path / "ck", model, cfg, tokenizer_dir=tok_dir, meta={"kind": "pretrain", "step": 1})
    assert cli("export", str(tmp_path / "ck"), "--out", str(tmp_path / "hf")) == 0
    assert json.loads((tmp_path / "hf" / "xlnet_pretraining.json").read_text())["model"]["objective"] == objective
    transformers.XLNetLMHeadModel.from_pretrained(tmp_path / "hf")
    assert cli("import", "--from-hf", str(tmp_path / "hf"), "--out", str(tmp_path / "back")) == 0
    back, _, _ = load_model_dir(tmp_path / "back")
    assert back.model.objective == objective
    ids, tt, perm, tmap = batch()
    with torch.no_grad():
        want = model(ids, tt, None, perm, target_mapping=tmap).logits
        got = load_lm_model(tmp_path / "back")[0](ids, tt, None, perm, target_mapping=tmap).logits
    assert torch.equal(want, got)
    rec = tmp_path / "hf" / "xlnet_pretraining.json"
    saved = json.loads(rec.read_text())
    saved["model"]["objective"] = "dae"
    rec.write_text(json.dumps(saved))
    with pytest.raises(CheckpointError, match=r"xlnet_pretraining.json: model.objective must be one of plm, mlm"):
        api.load(tmp_path / "hf")


def test_import_transformers_save_pretrained(tmp_path):
    """A directory written by transformers itself (as a downloaded xlnet-base-cased copy would be)."""
    hc = transformers.XLNetConfig(
        vocab_size=50, d_model=32, n_layer=2, n_head=4, d_inner=64, mem_len=None, reuse_len=None
    )
    torch.manual_seed(1)
    hf = transformers.XLNetLMHeadModel(hc).eval()
    with torch.no_grad():
        hf.lm_loss.bias.normal_(0, 0.1)
    hf.save_pretrained(tmp_path / "hf")
    assert cli("import", "--from-hf", str(tmp_path / "hf"), "--out", str(tmp_path / "ck")) == 0
    xl = api.load(tmp_path / "ck")
    xl_direct = api.load(tmp_path / "hf")  # an HF dir loads directly too
    ids, tt, perm, tmap = batch(V=50)
    with torch.no_grad():
        h = hf(ids, token_type_ids=tt, perm_mask=perm, target_mapping=tmap, use_mems=True)
    for m in (xl, xl_direct):
        o = m(ids, token_type_ids=tt, perm_mask=perm, target_mapping=tmap)
        assert torch.allclose(o.logits, h.logits, atol=1e-5, rtol=0)
        assert o.hidden.shape == (2, 16, 32) and o.query.shape == (2, 3, 32)
        o2 = m(ids, token_type_ids=tt, perm_mask=perm, target_mapping=tmap, mems=o.mems)
        h2 = hf(ids, token_type_ids=tt, perm_mask=perm, target_mapping=tmap, mems=mems_to_hf(o.mems), use_mems=True)
        assert torch.allclose(o2.logits, h2.logits, atol=1e-5, rtol=0)


def test_api_hf_style_call(ckpt):
    xl = api.load(ckpt, attn_impl="einsum")
    ids, tt, perm, tmap = batch()
    am = np.ones((2, 16), dtype=np.float32)
    am[1, :3] = 0
    out = xl(ids.tolist(), token_type_ids=tt, attention_mask=am, perm_mask=perm, target_mapping=tmap)
    assert out.logits.shape == (2, 3, 400) and not out.logits.requires_grad
    assert len(out.mems) == 2 and out.mems[0].shape == (2, 8, 32)
    full = xl(ids)  # no targets: content-stream logits for every position
    assert full.logits.shape == (2, 16, 400) and full.query is None


def test_checkpoint_errors(ckpt, tmp_path):
    cfg, _, _ = load_model_dir(ckpt)
    other = dataclasses.replace(cfg.model, d_model=64, d_head=16)
    with pytest.raises(CheckpointError, match=r"model.d_model=32 but the requested config has model.d_model=64"):
        load_lm_model(ckpt, expect=other)
    with pytest.raises(CheckpointError, match="not found"):
        resolve_checkpoint(tmp_path / "nope")
    with pytest.raises(CheckpointError, match="holds no checkpoint"):
        resolve_checkpoint(tmp_path)
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "model.safetensors").write_bytes(b"garbage")
    src = resolve_checkpoint(ckpt)
    (bad / "config.yaml").write_text((src / "config.yaml").read_text())
    with pytest.raises(CheckpointError, match=r"no meta\.json"):  # assembled by hand: nothing in it can be checked
        load_model_dir(bad)
    digests = {n: sha256_file(bad / n) for n in ("model.safetensors", "config.yaml")}
    (bad / "meta.json").write_text(json.dumps({"sha256": digests}))  # garbage with a matching checksum
    with pytest.raises(CheckpointError, match="corrupt"):
        load_model_dir(bad)
    assert cli("export", str(tmp_path / "nope"), "--out", str(tmp_path / "o")) == 2
    assert not (tmp_path / "o").exists()
    (tmp_path / "notxl").mkdir()
    (tmp_path / "notxl" / "config.json").write_text(json.dumps({"model_type": "bert"}))
    assert cli("import", "--from-hf", str(tmp_path / "notxl"), "--out", str(tmp_path / "o")) == 2
    # export refuses a d_model that HF cannot express
    wide = ModelConfig(vocab_size=10, d_model=32, n_layer=1, n_head=2, d_head=8, d_inner=8)
    from xlnetcli.model.state_dict_adapter import to_hf_config

    with pytest.raises(CheckpointError, match="n_head\\*d_head == d_model"):
        to_hf_config(wide)


def test_import_of_our_export_keeps_the_runs_training_and_finetuning_sections(tok_dir, tmp_path, capsys):
    """`xlnet export` keeps the run's config in xlnet_pretraining.json and `xlnet import` restores its tokenizer, data,
    train and finetune sections (they were reset to the paper's defaults); a bad 'config' field is one error naming
    the file, nothing written."""
    from clitools import run_main

    from xlnetcli.config import config_to_dict, replace

    cfg = replace(
        make_cfg(400),
        train={"lr": 3e-4, "max_steps": 123, "warmup_steps": 7, "weight_decay": 0.05},
        finetune={"lr": 7e-5, "batch_size": 24, "micro_batch_size": 8, "max_seq_length": 96, "layer_decay": 0.8},
        data={"mask_alpha": 4},
    )
    torch.manual_seed(0)
    save_model_dir(tmp_path / "ck", XLNetLMHeadModel(cfg.model), cfg, tokenizer_dir=tok_dir, meta={"kind": "pretrain"})
    assert cli("export", str(tmp_path / "ck"), "--out", str(tmp_path / "hf")) == 0
    assert cli("import", "--from-hf", str(tmp_path / "hf"), "--out", str(tmp_path / "back")) == 0
    back, _, _ = load_model_dir(tmp_path / "back")
    want, got = config_to_dict(cfg), config_to_dict(back)
    for section in ("tokenizer", "data", "train", "finetune"):
        assert got[section] == want[section], section
    assert (back.train.lr, back.finetune.lr, back.finetune.batch_size) == (3e-4, 7e-5, 24)
    rec = tmp_path / "hf" / "xlnet_pretraining.json"
    saved = json.loads(rec.read_text())
    saved["config"]["finetune"]["lr"] = "fast"
    rec.write_text(json.dumps(saved))
    before = sorted(p.name for p in tmp_path.iterdir())
    capsys.readouterr()
    code, _, err = run_main(capsys, "import", "--from-hf", tmp_path / "hf", "--out", tmp_path / "again")
    assert code == 2 and err.startswith("xlnet: error:") and len(err.strip().splitlines()) == 1, err
    assert "xlnet_pretraining.json" in err and "finetune.lr" in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == before
