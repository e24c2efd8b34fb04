"""Checkpoints: step folders, loading them (ours or Hugging Face directories), and the loaded-LM API.

run_dir/step_0001000/
    model.safetensors   our state-dict names (model/xlnet.py), tied LM weight stored once
    config.yaml         the full resolved Config
    tokenizer/          the tokenizer folder (copied): spiece.model, xlnet_tokenizer.json, tokenizer.json, ...
    meta.json           {"kind": "pretrain"|"finetune"|"import", "step": int, ..., "sha256": {file: digest}}
    train_state.safetensors  a training run's state, written by train/checkpointer.py

folders.py   step folder names, writing one atomically with its checksums, checking them; finding a tokenizer
load.py      resolving a path to a checkpoint, loading and checking its weights and config
hf_dir.py    reading a Hugging Face XLNet directory, the task heads' mapping to transformers' classes
lm.py        a loaded XLNet LM with HF-style arguments (published as xlnetcli.api)
"""
