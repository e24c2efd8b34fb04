"""The Python API: load a checkpoint (ours or an HF directory) and run XLNet with HF-style arguments.

    from xlnetcli import api
    xl = api.load("runs/tiny")                       # run dir, step folder, or HF dir (e.g. a copy of xlnet-base-cased)
    out = xl(input_ids, token_type_ids=seg, attention_mask=am, perm_mask=pm, target_mapping=tm)
    out.logits, out.hidden, out.query, out.mems      # batch-first; mems: per layer [B, M, d]
    out2 = xl(next_ids, mems=out.mems)               # Transformer-XL memory across segments

The implementation is xlnetcli/checkpoint/lm.py; this module is the stable public name.
"""

from xlnetcli.checkpoint.lm import XLNet, load

__all__ = ["XLNet", "load"]
