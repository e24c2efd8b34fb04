"""The pretraining data stream: records (record_format.py) + the factorisation order sampled online (docs/xlnet.md §5).

    stream = PretrainStream("records/", "train", rank=0, world=1, micro_batch_size=8, seed=1234)
    for batch in stream:            # micro-batches in (step, micro_index) order, forever (passes repeat)
        out = model(batch["input_ids"], batch["token_type_ids"], perm_mask=batch["perm_mask"],
                    target_index=batch["target_index"], labels=batch["labels"], label_mask=batch["label_mask"])
    state = stream.state_dict()     # cursor; load_state_dict(state) resumes exactly
    stream.load_state_dicts(states) # every rank's cursor of a run with another layout (world, micro_batch_size)

Rows are the unit: one set of records serves any micro_batch_size and number of processes that divide the global
batch. Reading row g' of a layout is (forward row, reversed?) by record_format.row_source under the reader's
micro_batch_size (with bi_data every micro-batch is [forward half ; the same rows reversed], as the model needs), found
in the records by ``stored_rows``; an example, its targets and its factorisation order belong to its stored row, so
every layout trains on the same examples in the same orders.

The factorisation order (the original ``_local_perm``) is kept as two O(B·L) rank vectors per example:
``perm_q_rank`` and ``perm_k_rank`` with ``perm_mask[b,i,j] = perm_q_rank[b,i] <= perm_k_rank[b,j]`` (1 = i cannot
attend j), see ``perm_mask_from_ranks``. For every part (the reuse part [0, R) and the rest [R, L)) with its own random
order: rank = position in the order; context tokens (not selected, not <sep>/<cls>) get rank -1 so they are seen by
all and see no selected or functional token; selected tokens see context plus what comes earlier in the order (never
themselves, in the query stream); functional tokens also see themselves. The rest's ranks are offset by R+1, which
makes the reuse part blind to the rest and lets the rest see the whole reuse part — one comparison does both.
``perm_size`` blocks: the part is cut in blocks of perm_size; block b's ranks are b*perm_size + sigma(k), one random
permutation sigma per part and example shared by its blocks, as the original's transpose/shuffle/transpose.
The order is a pure function of (seed, step, stored row): a splitmix64 hash, vectorised over the batch.

``objective`` (model.objective) swaps the order for the paper's ablations on the same records and backbone:
``mlm`` ("DAE + Transformer-XL", Table 6): the targets' input tokens become <mask> and attention is full within each
part (the reuse part still blind to the rest, so memory carries nothing of the next window's text); the model predicts
the targets from the content stream. ``clm`` (Transformer-XL's LM): every position in its natural order, so each token
sees only earlier positions (and memory); the query stream predicts the same targets from the tokens before them.
"""

from __future__ import annotations

import queue
import threading
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from xlnetcli.config import OBJECTIVES
from xlnetcli.core.errors import CheckpointError, ConfigError, DataError
from xlnetcli.data.records.format import open_records, segment_ids, stored_rows
from xlnetcli.data.special import CLS_ID, MASK_ID, SEP_ID

_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64 finaliser on uint64 arrays (wrapping arithmetic)."""
    x = x ^ (x >> np.uint64(30))
    x = x * _M1
    x = x ^ (x >> np.uint64(27))
    x = x * _M2
    return x ^ (x >> np.uint64(31))


_U64 = 2**64 - 1
_GOLDEN_I, _M1_I, _M2_I = int(_GOLDEN), int(_M1), int(_M2)


def _mix_int(x: int) -> int:
    """``_mix`` on a Python int (same value, no numpy scalar overhead)."""
    x ^= x >> 30
    x = (x * _M1_I) & _U64
    x ^= x >> 27
    x = (x * _M2_I) & _U64
    return x ^ (x >> 31)


def order_keys(seed: int, step: int, rows: np.ndarray, part: int, n: int) -> np.ndarray:
    """uint64 [B, n] random keys, a pure function of (seed, step, row, part, k)."""
    rows = np.asarray(rows, dtype=np.uint64)
    with np.errstate(over="ignore"):
        h = _mix(np.uint64(seed & (2**64 - 1)) * _GOLDEN + np.uint64(0x5EED))
        h = _mix(h ^ (np.uint64(step & (2**64 - 1)) * _M1 + np.uint64(1)))
        h = _mix(h ^ (rows * _M2 + np.uint64(2 + part)))  # [B]
        k = np.arange(n, dtype=np.uint64)
        return _mix(h[:, None] + (k[None, :] + np.uint64(1)) * _GOLDEN)


def _order_layout(reuse_len: int, seq_len: int, perm_size: int) -> tuple[np.ndarray, np.ndarray]:
    """(column of each position in the [2 * perm_size] sigma table, block base rank) for the two parts."""
    key = (reuse_len, seq_len, perm_size)
    hit = _LAYOUTS.get(key)
    if hit is None:
        cols, base = [], []
        for part, (a, b) in enumerate(((0, reuse_len), (reuse_len, seq_len))):
            n = b - a
            if n % perm_size:
                raise ConfigError(f"perm_size {perm_size} must divide the part length {n}")
            k = np.arange(n)
            cols.append(part * perm_size + k % perm_size)
            base.append(k // perm_size * perm_size)
        hit = _LAYOUTS[key] = (np.concatenate(cols), np.concatenate(base))
    return hit


_LAYOUTS: dict[tuple[int, int, int], tuple[np.ndarray, np.ndarray]] = {}


def sample_order(seed: int, step: int, rows: np.ndarray, reuse_len: int, seq_len: int, perm_size: int) -> np.ndarray:
    """int64 [B, L]: rank of each position in its part's factorisation order (0-based inside the part)."""
    cols, base = _order_layout(reuse_len, seq_len, perm_size)
    rows = np.asarray(rows, dtype=np.uint64)
    B = len(rows)
    h0 = _mix_int((seed * _GOLDEN_I + 0x5EED) & _U64)  # order_keys for both parts at once (same values)
    h0 = _mix_int(h0 ^ ((step * _M1_I + 1) & _U64))
    with np.errstate(over="ignore"):
        h = _mix(np.uint64(h0) ^ (rows[:, None] * _M2 + np.array([2, 3], np.uint64)[None, :]))  # [B, 2]
        k = (np.arange(perm_size, dtype=np.uint64) + np.uint64(1)) * _GOLDEN
        keys = _mix(h[:, :, None] + k[None, None, :])  # [B, 2, P]
    # argsort by sorting: the key's low bits replaced by the index (a plain sort is several times faster)
    low = np.uint64((1 << max(1, (perm_size - 1).bit_length())) - 1)
    keys &= ~low
    keys |= np.arange(perm_size, dtype=np.uint64)
    keys.sort(axis=-1)
    keys &= low
    sigma = keys.reshape(B, 2 * perm_size).view(np.int64)
    if perm_size == reuse_len == seq_len - reuse_len:  # one block per part: sigma is the order itself
        return sigma
    return sigma[:, cols] + base


def ranks_from_order(
    input_ids: np.ndarray, is_masked: np.ndarray, rank: np.ndarray, reuse_len: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(q_rank, k_rank, is_target) [B, L] from the order ``rank`` [B, L] (original _local_perm formulas)."""
    L = input_ids.shape[1]
    func = (input_ids == SEP_ID) | (input_ids == CLS_ID)
    tgt = is_masked & ~func
    off = _offsets(L, reuse_len)
    k_rank = rank + off
    np.copyto(k_rank, off - 1, where=~(is_masked | func))  # context: rev = -1
    q_rank = k_rank + ~tgt  # self_rev = rev for targets, rev + 1 otherwise
    return q_rank, k_rank, tgt


def natural_order_ranks(input_ids: np.ndarray, is_masked: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """CLM: (q_rank, k_rank, is_target) for the left-to-right order. k_rank = position, q_rank = position for targets
    and position + 1 otherwise: a target sees exactly the positions before it, the content stream position i sees
    positions <= i (lower-triangular), and the reuse part never sees the rest (it comes first)."""
    B, L = input_ids.shape
    tgt = is_masked & ~((input_ids == SEP_ID) | (input_ids == CLS_ID))
    k_rank = np.broadcast_to(np.arange(L, dtype=np.int64), (B, L)).copy()
    return k_rank + ~tgt, k_rank, tgt


def bidirectional_ranks(
    input_ids: np.ndarray, is_masked: np.ndarray, reuse_len: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """MLM: (q_rank, k_rank, is_target) with no order: every position sees its whole part, and the rest also sees the
    reuse part (k_rank = [j >= R], q_rank = 1 + [i >= R]: only (i < R, j >= R) is masked)."""
    B, L = input_ids.shape
    tgt = is_masked & ~((input_ids == SEP_ID) | (input_ids == CLS_ID))
    rest = np.broadcast_to(np.arange(L) >= reuse_len, (B, L)).astype(np.int64)
    return rest + 1, rest.copy(), tgt


def _offsets(seq_len: int, reuse_len: int) -> np.ndarray:
    key = (seq_len, reuse_len)
    off = _OFFSETS.get(key)
    if off is None:
        off = _OFFSETS[key] = (np.arange(seq_len) >= reuse_len).astype(np.int64) * (reuse_len + 1)
    return off


_OFFSETS: dict[tuple[int, int], np.ndarray] = {}


def perm_mask_from_ranks(q_rank: Any, k_rank: Any) -> Any:
    """bool [B, L, L] (True = i cannot attend j) from the two rank vectors (torch or numpy; builds on their device)."""
    return q_rank[:, :, None] <= k_rank[:, None, :]


def make_perm_mask(
    input_ids: Any,
    is_masked: Any,
    reuse_len: int,
    perm_size: int | None = None,
    seed: int = 0,
    step: int = 0,
    rows: Any = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(perm_mask float [B, L, L], is_target bool [B, L]) for token ids and selected positions.

    For tests and the engine's parity checks: ``make_perm_mask(ids, sel, reuse_len=L//2)``.
    ``reuse_len`` may be 0 (one part, no memory) and ``perm_size`` defaults to each part's length."""
    ids = np.asarray(input_ids.cpu() if torch.is_tensor(input_ids) else input_ids)
    sel = np.asarray(is_masked.cpu() if torch.is_tensor(is_masked) else is_masked).astype(bool)
    B, L = ids.shape
    rows = np.arange(B) if rows is None else np.asarray(rows)
    if reuse_len == 0:
        rank = sample_order(seed, step, rows, 0, L, perm_size or L)
    else:
        if perm_size is None:
            r0 = sample_order(seed, step, rows, reuse_len, reuse_len * 2, reuse_len)[:, :reuse_len]
            r1 = sample_order(seed, step, rows, 0, L - reuse_len, L - reuse_len)
            rank = np.concatenate([r0, r1], 1)
        else:
            rank = sample_order(seed, step, rows, reuse_len, L, perm_size)
    q, k, tgt = ranks_from_order(ids, sel, rank, reuse_len)
    return perm_mask_from_ranks(torch.from_numpy(q), torch.from_numpy(k)).float(), torch.from_numpy(tgt)


def targets(is_target: np.ndarray, input_ids: np.ndarray, num_predict: int) -> dict[str, np.ndarray]:
    """target_index [B, P] (sorted positions, 0 for padding), labels [B, P], label_mask [B, P] float."""
    B, L = is_target.shape
    f = np.flatnonzero(is_target)  # row-major: positions sorted within each row
    count = np.count_nonzero(is_target, axis=1)
    if len(f) and count.max() > num_predict:
        raise DataError(f"an example has {int(count.max())} targets, more than num_predict = {num_predict}")
    rows = np.arange(B)
    dst = np.arange(len(f)) + np.repeat(rows * num_predict - (np.cumsum(count) - count), count)  # row r, slot k
    index = np.zeros((B, num_predict), np.int64)
    index.reshape(-1)[dst] = f - np.repeat(rows * L, count)
    labels = np.zeros((B, num_predict), input_ids.dtype)
    labels.reshape(-1)[dst] = input_ids.reshape(-1)[f]
    label_mask = np.arange(num_predict)[None, :] < count[:, None]
    return {"target_index": index, "labels": labels, "label_mask": label_mask}


def target_mapping(target_index: torch.Tensor, label_mask: torch.Tensor, seq_len: int) -> torch.Tensor:
    """float [B, P, L] one-hot rows of the targets, zero rows for padding."""
    B, P = target_index.shape
    out = torch.zeros(B, P, seq_len)
    out.scatter_(2, target_index[:, :, None], label_mask[:, :, None].float())
    return out


def permutation_batch(
    input_ids: np.ndarray,
    is_masked: np.ndarray,
    alen: np.ndarray,
    rows: np.ndarray,
    step: int,
    meta: dict,
    seed: int,
    dense: bool = True,
    objective: str = "plm",
) -> dict[str, Any]:
    """Everything the engine needs for one micro-batch of records (see PretrainStream)."""
    L, R, P = meta["seq_len"], meta["reuse_len"], meta["num_predict"]
    ids = input_ids.astype(np.int64)
    if objective == "plm":
        rank = sample_order(seed, step, rows, R, L, meta["perm_size"])
        q, k, tgt = ranks_from_order(ids, is_masked, rank, R)
    elif objective == "clm":
        q, k, tgt = natural_order_ranks(ids, is_masked)
    elif objective == "mlm":
        q, k, tgt = bidirectional_ranks(ids, is_masked, R)
    else:
        raise ConfigError(f"unknown objective {objective!r} (choose from {', '.join(OBJECTIVES)})")
    t = targets(tgt, ids, P)  # labels: the original tokens
    if objective == "mlm":
        ids = np.where(tgt, MASK_ID, ids)  # the DAE corruption: no target token is in the input
    batch: dict[str, Any] = {
        "input_ids": torch.from_numpy(ids),
        "token_type_ids": torch.from_numpy(segment_ids(alen, L, R)),
        "perm_q_rank": torch.from_numpy(q),
        "perm_k_rank": torch.from_numpy(k),
        "target_index": torch.from_numpy(t["target_index"]),
        "labels": torch.from_numpy(t["labels"]),
        "label_mask": torch.from_numpy(t["label_mask"].astype(np.float32)),
        "is_target": torch.from_numpy(tgt),
    }
    if dense:
        batch["perm_mask"] = perm_mask_from_ranks(batch["perm_q_rank"], batch["perm_k_rank"]).float()
        batch["target_mapping"] = target_mapping(batch["target_index"], batch["label_mask"], L)
    return batch


class PretrainStream:
    """Micro-batches of rank ``rank`` of ``world``, in (step, micro_index) order, with an exact-resume cursor.

    Rows: rank r with accumulation A = G / (micro_batch_size * world) reads micro-batch a = reading rows
    [(r*A + a)*mb, (r*A + a + 1)*mb) at every step; a row is a fixed contiguous text stream (memory needs it). Any
    micro_batch_size and world that divide G read the same records: with bi_data a micro-batch is [mb/2 forward rows ;
    the same rows reversed] whatever the records' micro_batch_size, its rows found by ``stored_rows`` (``rows``), and
    each example, its targets and its factorisation order are those of its stored row. With the records' own
    micro_batch_size the mapping is the identity.
    Steps run through pass 0, 1, ... and start again at pass 0 (with fresh factorisation orders) when done.
    ``dense=False`` leaves out perm_mask [B,L,L] and target_mapping [B,P,L] (build them on the device from
    ``perm_q_rank``/``perm_k_rank`` and ``target_index``: ``perm_mask_from_ranks``, ``target_mapping``).
    ``pin_memory``: the prefetch thread pins each batch (CUDA), so that its non-blocking copy to the device does not
    wait for the device's queue (a pageable copy may).
    ``loop=False`` stops after one run over all passes (evaluation). ``objective`` (model.objective: plm, mlm, clm)
    chooses the order and the input corruption (see the module docstring); the records are the same for all three.
    """

    def __init__(
        self,
        records_dir: str | Path,
        split: str = "train",
        rank: int = 0,
        world: int = 1,
        micro_batch_size: int | None = None,
        seed: int = 0,
        dense: bool = True,
        prefetch: int = 2,
        loop: bool = True,
        objective: str = "plm",
        pin_memory: bool = False,
    ):
        if objective not in OBJECTIVES:
            raise ConfigError(f"unknown objective {objective!r} (choose from {', '.join(OBJECTIVES)})")
        self.objective = objective
        self.meta, self.passes = open_records(records_dir, split)
        self.records_dir, self.split, self.seed, self.dense, self.prefetch, self.loop = (
            Path(records_dir),
            split,
            seed,
            dense,
            prefetch,
            loop,
        )
        self.pin_memory = pin_memory
        self._open: weakref.WeakSet = weakref.WeakSet()  # iterators not yet finished (close() stops their threads)
        G, mb_rec = self.meta["global_batch_size"], self.meta["micro_batch_size"]
        mb = mb_rec if micro_batch_size is None else micro_batch_size
        if mb < 1 or world < 1 or not 0 <= rank < world:
            raise ConfigError(f"invalid micro_batch_size {mb} / rank {rank} / world {world}")
        if self.meta["bi_data"] and mb % 2:
            raise ConfigError(f"the per-device batch ({mb}) must be even with bi_data (half forward, half backward)")
        if G % (mb * world):
            raise ConfigError(
                f"records hold {G} rows (global batch); micro_batch_size {mb} x world {world} must divide it; "
                f"re-run `xlnet preprocess` with train.global_batch_size a multiple of {mb * world}"
            )
        self.micro_batch_size, self.rank, self.world = mb, rank, world
        self.accumulation = G // (mb * world)
        first = rank * self.accumulation * mb
        self._rows = [
            stored_rows(np.arange(first + a * mb, first + (a + 1) * mb), self.meta["bi_data"], mb, mb_rec)
            for a in range(self.accumulation)
        ]
        self.steps_per_pass = self.meta["splits"][split]["steps_per_pass"]
        self.total_steps = self.steps_per_pass * len(self.passes)
        self.step, self.micro = 0, 0

    # cursor -------------------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The cursor; at a step boundary (micro 0) any layout can continue it (``load_state_dicts``)."""
        return {
            "step": self.step,
            "micro": self.micro,
            "seed": self.seed,
            "split": self.split,
            "rank": self.rank,
            "world": self.world,
            "micro_batch_size": self.micro_batch_size,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """This rank's cursor, saved by a run of the same layout (the same world and micro_batch_size)."""
        for key in ("world", "micro_batch_size"):
            if key in state and state[key] != getattr(self, key):
                raise ConfigError(f"cannot resume the data stream: saved {key}={state[key]}, now {getattr(self, key)}")
        self.step, self.micro = int(state["step"]), int(state["micro"])
        self.seed = int(state.get("seed", self.seed))

    def load_state_dicts(self, states: list[dict[str, Any]]) -> None:
        """The cursor of a run saved with another layout (``states``: every rank's): rows are the unit, so the step is
        all it needs; a cursor inside a step cannot be re-assigned."""
        at = {(int(s["step"]), int(s["micro"])) for s in states}
        step, micro = min(at)
        if len(at) > 1 or micro:
            was = f"{len(states)} process(es) x micro_batch_size {states[0].get('micro_batch_size')}"
            raise CheckpointError(
                f"the checkpoint's data cursor is inside step {step} (micro-batch {micro}); resume it with the layout "
                f"that wrote it ({was})"
            )
        self.step, self.micro = step, 0
        self.seed = int(states[0].get("seed", self.seed))

    def rows(self, micro: int) -> np.ndarray:
        """The stored rows of micro-batch ``micro`` (the same at every step)."""
        return self._rows[micro]

    def batch(self, step: int, micro: int) -> dict[str, Any]:
        """The micro-batch at (step, micro); a pure function of the records, the seed and these two numbers."""
        p = self.passes[(step // self.steps_per_pass) % len(self.passes)]
        s = step % self.steps_per_pass
        rows = self.rows(micro)
        ids, masked, alen = p.examples(rows, s)  # tokens read from the shards (record_format.py)
        b = permutation_batch(ids, masked, alen, rows, step, self.meta, self.seed, self.dense, self.objective)
        b["micro_index"] = micro
        b["step"] = step
        return b

    def _positions(self, step: int, micro: int) -> Iterator[tuple[int, int]]:
        while self.loop or step < self.total_steps:
            yield step, micro
            micro += 1
            if micro == self.accumulation:
                step, micro = step + 1, 0

    # iteration ------------------------------------------------------------------------------------------------
    def __iter__(self) -> Iterator[dict[str, Any]]:
        it = self._batches()
        self._open.add(it)
        return it

    def close(self) -> None:
        """Finish every open iterator of this stream, joining its prefetch thread. Call it before the process exits: a
        daemon thread still inside torch when the interpreter shuts down aborts the process ("terminate called without
        an active exception")."""
        for it in list(self._open):
            it.close()

    def _batches(self) -> Iterator[dict[str, Any]]:
        start = (self.step, self.micro)
        if self.prefetch <= 0:
            for st, mi in self._positions(*start):
                b = self.batch(st, mi)
                self._advance(st, mi)
                yield b
            return
        q: queue.Queue = queue.Queue(self.prefetch)
        stop = threading.Event()
        done = object()
        # pinning runs in the current device's context: the thread's own default is device 0, which would open a
        # context there for every rank of a multi-GPU job (torch's DataLoader sets the device in its pin thread too)
        pin_device = torch.cuda.current_device() if self.pin_memory else None

        def hand_over(item: Any) -> bool:  # False once the consumer has stopped (never blocks past that)
            while not stop.is_set():
                try:
                    q.put(item, timeout=0.1)
                    return True
                except queue.Full:
                    continue
            return False

        def produce() -> None:
            try:
                if pin_device is not None:
                    torch.cuda.set_device(pin_device)
                for st, mi in self._positions(*start):
                    b = self.batch(st, mi)
                    if self.pin_memory:
                        b = {k: v.pin_memory() if isinstance(v, torch.Tensor) else v for k, v in b.items()}
                    if not hand_over((st, mi, b)):
                        return
                hand_over(done)
            except BaseException as e:  # noqa: BLE001 - any failure goes to the consumer, which re-raises it
                hand_over(e)

        th = threading.Thread(target=produce, name="xlnet-prefetch", daemon=True)
        th.start()
        try:
            while True:
                item = q.get()
                if item is done:
                    return
                if isinstance(item, BaseException):
                    raise item
                st, mi, b = item
                self._advance(st, mi)
                yield b
        finally:
            stop.set()
            th.join(timeout=5)

    def _advance(self, step: int, micro: int) -> None:
        micro += 1
        if micro == self.accumulation:
            step, micro = step + 1, 0
        self.step, self.micro = step, micro
