"""Model FLOPs of a pretraining step, and the peak rates used for model FLOPs utilisation (MFU).

The count is the matrix arithmetic the XLNet objective needs (2 FLOPs per multiply-add), per example and layer:

    queries      2·N·d·HD         N = L + P stacked rows (content stream + query stream on the P targets)
    keys, values 2·2·K·d·HD       K = M + L (memory + current segment)
    positions    2·G·R·d·HD / B   the projected relative-position table, once per batch half (G = 2 with bi_data)
    scores       2·N·K·HD         content term (q + r_w)·k
    position     2·N·K·HD         position term (q + r_r)·kr, counted for the K columns each row uses (the kernel
                                  computes R = K + L columns and gathers; the extra columns are not counted)
    mix          2·N·K·HD         probabilities · values
    output       2·N·HD·d
    feed-forward 2·2·N·d·d_inner

plus the LM head 2·P·d·V. In pretraining the last layer computes only the P query rows (N = P there). A training step
is 3x the forward (backward = 2x).

By model.objective: ``plm`` as above; ``clm`` the same count (the natural order is one more factorisation order: the
query stream still predicts the P targets, and masked scores are computed like PLM's); ``mlm`` has no query stream
(N = L in every layer, the last included: the targets are read from its content rows) and the same head 2·P·d·V.

Element-wise work, softmax and the segment term are not counted, so MFU here is the conservative "useful work"
figure, as in the PaLM paper's appendix B.
"""

from __future__ import annotations

import torch

from xlnetcli.config import ModelConfig

# bf16 dense peak (TFLOP/s) of known accelerators, from their data sheets (no sparsity).
PEAK_BF16_TFLOPS = {
    "H200": 989.4,
    "H100 SXM": 989.4,
    "H100 80GB HBM3": 989.4,
    "H100 PCIe": 756.0,
    "H100 NVL": 835.0,
    "H100": 989.4,
    "GH200": 989.4,
    "B200": 2250.0,
    "A100": 312.0,
    "A10G": 70.0,
    "L4": 121.0,
    "L40S": 362.0,
    "RTX 4090": 165.2,
    "RTX 3090": 71.0,
    "V100": 125.0,
}


def peak_tflops(device_name: str) -> float | None:
    """Data-sheet bf16 dense peak for a device name such as 'NVIDIA H100 80GB HBM3' (longest matching key), or None."""
    hits = [k for k in PEAK_BF16_TFLOPS if k.lower() in device_name.lower()]
    return PEAK_BF16_TFLOPS[max(hits, key=len)] if hits else None


def forward_flops(
    m: ModelConfig, batch: int, seq_len: int, mem_len: int, num_predict: int, last_layer_query_only: bool = True
) -> float:
    """Forward model FLOPs of one micro-batch (see the module docstring)."""
    d, hd, L, M, P = m.d_model, m.n_head * m.d_head, seq_len, mem_len, num_predict
    query_rows = 0 if m.objective == "mlm" else P  # mlm: no query stream
    last_rows = query_rows if last_layer_query_only and query_rows else L + query_rows
    K, R = M + L, M + 2 * L
    G = 2 if m.bi_data else 1

    def layer(N: int) -> float:
        return (
            2 * N * d * hd
            + 4 * K * d * hd
            + 2 * G * R * d * hd / batch
            + 3 * 2 * N * K * hd
            + 2 * N * hd * d
            + 4 * N * d * m.d_inner
        )

    per_example = (m.n_layer - 1) * layer(L + query_rows) + layer(last_rows)
    per_example += 2 * P * d * m.vocab_size
    return batch * per_example


def train_flops(m: ModelConfig, batch: int, seq_len: int, mem_len: int, num_predict: int) -> float:
    """Model FLOPs of one forward + backward of a micro-batch (3x the forward)."""
    return 3.0 * forward_flops(m, batch, seq_len, mem_len, num_predict)


def device_peak_tflops(device, configured: float = 0.0) -> float | None:
    """The bf16 peak used for MFU: ``configured`` (train.peak_tflops) when set, else the data sheet's for a known GPU;
    None on CPU or an unknown device (no MFU is logged then)."""
    if configured > 0:
        return configured
    if getattr(device, "type", "cpu") != "cuda":
        return None
    return peak_tflops(torch.cuda.get_device_name(device))
