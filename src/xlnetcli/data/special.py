"""XLNet's fixed special-token ids (the released spiece.model; docs/xlnet.md §1)."""

UNK_ID = 0  # <unk>
BOS_ID = 1  # <s>
EOS_ID = 2  # </s>
CLS_ID = 3  # <cls>: last token of every example; the `last` summary reads it
SEP_ID = 4  # <sep>: ends segment A and segment B
PAD_ID = 5  # <pad>
MASK_ID = 6  # <mask>: never fed in pretraining (the query stream starts from a learned vector)
EOD_ID = 7  # <eod>: end of document, an ordinary predictable token
EOP_ID = 8  # <eop>: end of paragraph (user-defined symbol in the original)

SPECIAL_PIECES = ("<unk>", "<s>", "</s>", "<cls>", "<sep>", "<pad>", "<mask>", "<eod>", "<eop>")
FUNCTIONAL_IDS = (SEP_ID, CLS_ID)  # never prediction targets; excluded from the factorisation order's targets

# Segment ids of [A <sep> B <sep> <cls>]: A and the first <sep> are 0, B and the second <sep> are 1, <cls> is 2.
SEG_ID_A, SEG_ID_B, SEG_ID_CLS, SEG_ID_PAD = 0, 1, 2, 4
