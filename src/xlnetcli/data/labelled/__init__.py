"""Finetuning data (docs/xlnet.md §9), split by job: reading labelled files into examples, and building the model's
inputs from them exactly as the original XLNet.

    read.py     TSV / CSV / JSONL tables (GLUE's columns found by name), JSONL multiple choice, SQuAD JSON; labels;
                unlabelled texts (one per line) and id columns for `xlnet embed`
    encode.py   [A <sep> B <sep> <cls>] left padded, multiple-choice options, SQuAD windows and answer positions

Code outside this package imports these names from here (``from xlnetcli.data import labelled``).
"""

from xlnetcli.data.labelled.encode import (
    SQUAD_FEATURES,
    SQUAD_INPUTS,
    SQUAD_LABELS,
    Encoded,
    Reading,
    build_pair,
    encode_choices,
    encode_squad,
    encode_texts,
    in_row_order,
    left_pad,
    squad_predictions,
    tokenize_with_offsets,
    truncate_pair,
)
from xlnetcli.data.labelled.read import (
    ID_NAMES,
    TASKS,
    ChoiceExample,
    Columns,
    SquadExample,
    TextExample,
    build_label_list,
    check_labels,
    parse_table,
    read_choices,
    read_ids,
    read_lines,
    read_squad,
    read_table,
    squad_is_v2,
)

__all__ = [
    "ID_NAMES",
    "SQUAD_FEATURES",
    "SQUAD_INPUTS",
    "SQUAD_LABELS",
    "TASKS",
    "ChoiceExample",
    "Columns",
    "Encoded",
    "Reading",
    "SquadExample",
    "TextExample",
    "build_label_list",
    "build_pair",
    "check_labels",
    "encode_choices",
    "encode_squad",
    "encode_texts",
    "in_row_order",
    "left_pad",
    "parse_table",
    "read_choices",
    "read_ids",
    "read_lines",
    "read_squad",
    "read_table",
    "squad_is_v2",
    "squad_predictions",
    "tokenize_with_offsets",
    "truncate_pair",
]
