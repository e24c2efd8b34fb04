"""The tokenizer stage (`xlnet tokenize`): XLNet's SentencePiece unigram tokenizer, split by job.

    normalize.py   the original text normalisation (preprocess_text), fast on whole blocks of lines
    spm_model.py   the SentencePiece model file read and extended through its protobuf wire format
    tokenizer.py   Tokenizer: loading a tokenizer folder, encoding with the digit-comma fix, saving
    hf_files.py    the same tokenizer as Hugging Face's tokenizer.json + tokenizer_config.json
    sample.py      the training sample, drawn while the corpus is read (bounded by lines and bytes), in workers
    train.py       training with XLNet's fixed ids (train_tokenizer), copying a tokenizer folder

Code outside this package imports these names from here.
"""

from xlnetcli.data.tokenizer.hf_files import (
    HF_FILE,
    HF_SPM_FILE,
    hf_tokenizer_config,
    hf_tokenizer_json,
    save_hf_files,
)
from xlnetcli.data.tokenizer.normalize import combining_table, normalize_block, normalize_lines, normalize_text
from xlnetcli.data.tokenizer.spm_model import ModelInfo, embed_options, read_model_info
from xlnetcli.data.tokenizer.tokenizer import SPIECE_FILE, Tokenizer, options_hash, word_start_mask
from xlnetcli.data.tokenizer.train import CONTROL_SYMBOLS, USER_DEFINED_SYMBOLS, copy_tokenizer, train_tokenizer

__all__ = [
    "CONTROL_SYMBOLS",
    "HF_FILE",
    "HF_SPM_FILE",
    "SPIECE_FILE",
    "USER_DEFINED_SYMBOLS",
    "ModelInfo",
    "Tokenizer",
    "combining_table",
    "copy_tokenizer",
    "embed_options",
    "hf_tokenizer_config",
    "hf_tokenizer_json",
    "normalize_block",
    "normalize_lines",
    "normalize_text",
    "options_hash",
    "read_model_info",
    "save_hf_files",
    "train_tokenizer",
    "word_start_mask",
]
