"""Pretraining: permutation language modelling on preprocessed records, with memory carried across steps.

    from xlnetcli.config import load_config
    from xlnetcli.train.pretrain import pretrain
    summary = pretrain(load_config("configs/tiny.yaml"), "records/", "runs/tiny", resume=None)

The loop, precision, checkpoints and resume are the engine's (train/engine.py); this module supplies the pretraining
workload (train/workload.py): the records stream, the PLM loss with memories, held-out evaluation, and which step
folders to keep.

Batch maths: ``train.global_batch_size`` rows (parallel text streams, fixed for the run) per optimizer step;
each of W processes runs A = global / (micro * W) micro-batches and accumulates gradients. Micro-batch a of rank r
reads rows [(r*A + a)*micro, (r*A + a + 1)*micro) of its layout (PretrainStream maps them to the records' rows, so
any micro and W that divide the global batch train on the same records), so memory is kept per micro-batch index a
(``mems[a]``) and always continues the same rows' text. The loss is the PLM cross entropy of the query stream on the
predicted tokens.

Run folder::

    out/
      config.yaml            resolved config of the run (a different config is refused unless resuming this run)
      metrics.jsonl          one JSON object per log line (split train / eval); TensorBoard in tensorboard/ if installed
      step_0000200/          a checkpoint (written to a temporary folder, fsynced, renamed; the last K are kept)
        model.safetensors config.yaml tokenizer/ meta.json
        train_state.safetensors       optimizer, grad scaler, step, RNG states, data cursors and memories (by records
                                      row) of every rank

The workload's stateful objects are its records stream (``data``: the cursor) and its ``Memories`` (``mems``), both of
each rank; the engine checkpoints them with everything else it keeps (train/checkpointer.py).

``resume="latest"`` (or a step number) continues exactly: same data, same dropout masks, same memories. Rows are the
unit, so a run may resume on another number of processes or with another train.micro_batch_size (same global batch,
same records): each rank takes the memories of its rows from whichever rank saved them and the data cursor from the
step, the losses stay the uninterrupted run's up to float rounding; only the dropout masks cannot follow (each
process's generators are re-seeded from (train.seed, step, rank)), which the header says in one line.
"""

from __future__ import annotations

import contextlib
import dataclasses
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from xlnetcli.checkpoint.folders import read_meta, step_folders, verify_checkpoint
from xlnetcli.checkpoint.load import StartingPoint, continued_model_config, load_starting_point, load_state
from xlnetcli.config import Config, ModelConfig, batch_maths, check_config, config_to_dict, replace
from xlnetcli.core import dist
from xlnetcli.core.errors import STARTUP_SIGTERM, CheckpointError, DataError, XLNetError
from xlnetcli.core.files import check_output_not_input, output_lock, sha256_file
from xlnetcli.core.signals import sigterm_stops
from xlnetcli.data.records.format import check_tokenizer_copy, find_shards
from xlnetcli.data.records.format import read_meta as records_meta
from xlnetcli.data.records.stream import PretrainStream
from xlnetcli.data.tokenizer import Tokenizer
from xlnetcli.evaluate.probe import ProbeSettings, probe_checkpoint, probe_labels, read_rows, split_rows
from xlnetcli.model import XLNetLMHeadModel, num_params
from xlnetcli.model.flops import train_flops
from xlnetcli.model.objective import Memories, evaluate_plm
from xlnetcli.model.objective import forward as _forward
from xlnetcli.model.objective import model_inputs as _model_inputs
from xlnetcli.report.plot import maybe_plot
from xlnetcli.report.trackers import require_trackers
from xlnetcli.train import lifecycle
from xlnetcli.train.checkpointer import resumable_steps
from xlnetcli.train.display import printer
from xlnetcli.train.engine import Engine
from xlnetcli.train.header import say_header
from xlnetcli.train.lifecycle import make_branch
from xlnetcli.train.plan import TrainPlan, run_precision
from xlnetcli.train.resume import resume_changes, resume_point, run_config_file
from xlnetcli.train.rng import seed_everything
from xlnetcli.train.workload import Evaluation, Hints

# train.* keys that may change when resuming a run (they do not change what is computed, only how often we
# log/evaluate/save, how long we train, or how the same maths is executed).
RESUME_MUTABLE = {
    "train.eval_every",
    "train.eval_batches",
    "train.save_every",
    "train.keep_last",
    "train.log_every",
    "train.compile",
    "train.static_shapes",
    "train.cuda_graphs",
    "train.activation_checkpointing",
    "train.distributed",
    "train.deterministic",
    "train.peak_tflops",
    "train.report_to",
    "train.probe_file",
    "train.probe_every",
    "train.micro_batch_size",  # the same global batch, other micro-batches: same examples (rows are the unit)
}

# The training settings a resume may change (``--resume --set train.lr=...``: after a divergence, or to train longer):
# each change is recorded (the run's config.yaml, a "change" row of metrics.jsonl, a header line), and from the resumed
# step on the run follows the new settings' lr schedule, recomputed over the (new) train.max_steps
# (docs/operations.md, "Changing settings on resume").
RESUME_CHANGEABLE = frozenset(
    {"train.lr", "train.clip_norm", "train.precision", "train.warmup_steps", "train.max_steps"}
)

# records meta key -> config key it must agree with
RECORD_KEYS = {
    "seq_len": "data.seq_len",
    "reuse_len": "model.reuse_len",
    "bi_data": "model.bi_data",
    "num_predict": "data.num_predict",
    "mask_alpha": "data.mask_alpha",
    "mask_beta": "data.mask_beta",
    "mask_mode": "data.mask_mode",
    "max_gram": "data.max_gram",
    "word_rule": "data.word_rule",
    "perm_size": "data.perm_size",
    "global_batch_size": "train.global_batch_size",
}


def list_checkpoints(out_dir: str | Path) -> list[tuple[int, Path]]:
    """Resumable step folders of a run (with train_state.safetensors), oldest first."""
    return resumable_steps(out_dir)


def _get(cfg_dict: dict, dotted: str) -> Any:
    section, key = dotted.split(".")
    return cfg_dict[section][key]


# ----------------------------------------------------------------------------------------------------------------
# Config resolution and input checks


def pretrain_config_path(data_dir: str | Path, out_dir: str | Path, resume: str | None) -> Path | None:
    """Which YAML to load when the user gave no --config: the run's own config when resuming, else the records'."""
    if resume is not None and (run_cfg := run_config_file(out_dir)) is not None:
        return run_cfg
    if (Path(data_dir) / "config.yaml").is_file():
        return Path(data_dir) / "config.yaml"
    return None


def check_records(cfg: Config, meta: dict, data_dir: str | Path) -> None:
    """The records must have been made with the settings this config trains with (docs/xlnet.md §10)."""
    want = config_to_dict(cfg)
    want["data"]["perm_size"] = cfg.perm_size
    for rkey, ckey in RECORD_KEYS.items():
        if rkey not in meta:
            continue
        have, need = meta[rkey], _get(want, ckey)
        if have != need:
            raise DataError(
                f"records in {data_dir} were preprocessed with {rkey}={have!r} but the config has {ckey}={need!r}; "
                f"re-run xlnet preprocess with this config, or pass --set {ckey}={have}"
            )
    vocab = meta.get("vocab_size")
    if vocab is not None and vocab != cfg.model.vocab_size:
        raise DataError(
            f"records in {data_dir} use a tokenizer with vocab_size={vocab} but the config has "
            f"model.vocab_size={cfg.model.vocab_size}; pass --set model.vocab_size={vocab} "
            f"--set tokenizer.vocab_size={vocab}"
        )


def check_run_dir(cfg: Config, out_dir: Path, resume: str | None) -> tuple[int, Path] | None:
    """Refuse to mix runs; return the checkpoint to resume from (step, folder) or None for a fresh start."""
    return resume_point(
        cfg,
        out_dir,
        resume,
        "pretraining run",
        ("tokenizer", "model", "data", "train"),
        RESUME_MUTABLE,
        "resume without that change (without --config the run's own config.yaml is used), or start a new run in "
        f"another --out (--init {out_dir} continues from its weights)",
        RESUME_CHANGEABLE,
    )


# ----------------------------------------------------------------------------------------------------------------
# The pretraining workload


def build_lm_model(cfg: Config) -> torch.nn.Module:
    return XLNetLMHeadModel(cfg.model)


class PretrainWorkload:
    """What pretraining plugs into the engine: the records stream of this rank, the PLM loss with one memory per
    micro-batch index, held-out evaluation on the valid split, and the last ``train.keep_last`` step folders."""

    name = "pretrain"
    loss_name = "PLM loss"
    elastic = True  # rows are the unit: resumes on any number of processes and micro-batch size (same global batch)

    def __init__(
        self,
        cfg: Config,
        data_dir: Path,
        meta: dict,
        env: dist.DistEnv,
        accum: int,
        say: Any,
        init: dict | None = None,
    ) -> None:
        t = cfg.train
        self.init = init  # where the weights started (StartingPoint.record()), kept in every step folder's meta.json
        self.hints = Hints(
            lengths=f"data.seq_len / model.mem_len ({cfg.data.seq_len}/{cfg.model.mem_len})",
            warmup="more train.warmup_steps",
        )
        self.cfg, self.data_dir, self.meta, self.env, self.accum, self.say = cfg, data_dir, meta, env, accum, say
        self.records = records_identity(data_dir)  # in every step folder's meta.json: a resume must read the same
        self.stream = PretrainStream(
            data_dir,
            "train",
            env.rank,
            env.world_size,
            t.micro_batch_size,
            cfg.data.seed,
            dense=False,
            objective=cfg.model.objective,
            pin_memory=env.device.type == "cuda",
        )
        static = (cfg.model.n_layer, cfg.model.d_model) if t.static_shapes else None
        self.mems = Memories(cfg.model.mem_len, [self.stream.rows(a) for a in range(accum)], env.device, static)
        self.keep_last = t.keep_last
        self._it: Any = None
        self.probe_rows: tuple | None = None  # (train, valid) rows of train.probe_file, probed every probe_every
        if t.probe_every:
            assert t.probe_file is not None  # check_config: train.probe_every needs train.probe_file
            self.probe_rows = split_rows(read_rows(t.probe_file), seed=t.seed)
            where = f"{t.probe_file} (train.probe_file)"
            probe_labels(*self.probe_rows, where, where)  # refused here, before the run folder is made
            self.probe_tok = Tokenizer.load(data_dir / "tokenizer")

    def next_batch(self, step: int, micro: int) -> dict:
        if self._it is None:
            self._it = iter(self.stream)
        try:
            batch = next(self._it)
        except StopIteration:
            raise DataError(
                f"records in {self.data_dir} ran out at step {step} of {self.cfg.train.max_steps}; preprocess with "
                "more data.passes or lower train.max_steps"
            ) from None
        return _model_inputs(batch, self.env.device)

    def loss(self, model: torch.nn.Module, batch: dict, micro: int) -> torch.Tensor:
        out = _forward(model, batch, **self.mems.inputs(micro, batch["input_ids"].shape[0]))
        self.mems.carry(micro, out)
        return out.loss

    def step_tokens(self) -> None:
        return None  # records are full rows: every token of the plan's batch is real

    def _due(self, every: int | str, step: int) -> bool:
        """Every ``every`` steps and at the last; never for eval_every=never (a word) or probe_every=0."""
        return isinstance(every, int) and every > 0 and (step % every == 0 or step == self.cfg.train.max_steps)

    def eval_due(self, step: int) -> bool:
        return self._due(self.cfg.train.eval_every, step) or self._due(self.cfg.train.probe_every, step)

    def evaluate(self, model: torch.nn.Module, step: int, log: Any) -> Evaluation | None:
        if self._due(self.cfg.train.probe_every, step):
            self.probe(model, step, log)
        return self._evaluate_plm(model, step, log) if self._due(self.cfg.train.eval_every, step) else None

    def probe(self, model: torch.nn.Module, step: int, log: Any) -> None:
        """Linear-probe accuracy of the frozen features on train.probe_file (evaluate/probe.py): does the representation
        pay off yet? Every rank takes part (FSDP gathers), rank 0 logs."""
        assert self.probe_rows is not None  # read in __init__ whenever train.probe_every is set
        train_rows, valid_rows = self.probe_rows
        settings = ProbeSettings(max_seq_length=self.cfg.finetune.max_seq_length, seed=self.cfg.train.seed)
        res = probe_checkpoint(dist.unwrap(model), self.probe_tok, train_rows, valid_rows, settings)
        acc = res["accuracy"]
        log(step, "probe", mean=acc["mean"], cls=acc["cls"], examples=len(valid_rows))
        self.say(
            f"  step {step}: probe accuracy mean {acc['mean']:.3f} cls {acc['cls']:.3f}"
            + (self._start_label() if step == 0 else "")
        )

    def _evaluate_plm(self, model: torch.nn.Module, step: int, log: Any) -> Evaluation | None:
        t = self.cfg.train
        if "valid" not in self.meta.get("splits", {"valid": None}):
            return None
        vstream = PretrainStream(
            self.data_dir,
            "valid",
            self.env.rank,
            self.env.world_size,
            t.micro_batch_size,
            self.cfg.data.seed,
            dense=False,
            loop=False,
            objective=self.cfg.model.objective,
        )
        res = evaluate_plm(model, vstream, t.eval_batches * self.accum, t.precision, self.env.device)
        if res["targets"] == 0:
            return None
        log(step, "eval", loss=res["loss"], ppl=res["ppl"], acc=res["acc"], targets=res["targets"])
        self.say(
            f"  step {step}: eval loss {res['loss']:.4f} ppl {res['ppl']:.2f} acc {res['acc']:.3f}"
            + (self._start_label() if step == 0 else "")
        )
        return Evaluation(metrics=res)

    def _start_label(self) -> str:
        return " (the starting model, on these records)" if self.init else " (initial weights)"

    def log_extras(self, step: int) -> dict:
        return {}

    def step_meta(self, step: int) -> dict:
        return {"kind": "pretrain", "records": self.records, **({"init": self.init} if self.init else {})}

    def states(self) -> dict:
        return {}

    def rank_states(self) -> dict:
        return {"data": self.stream, "mems": self.mems}

    def pinned_steps(self, with_state: bool) -> set[int]:
        return set()  # only the last train.keep_last step folders stay


def pretrain_plan(cfg: Config, accum: int) -> TrainPlan:
    t, L = cfg.train, cfg.data.seq_len
    return TrainPlan.from_config(
        cfg,
        "train",
        max_steps=t.max_steps,
        warmup_steps=t.warmup_steps,
        batch_shape=(t.global_batch_size, L),
        accumulation=accum,
        # model FLOPs per token at full memory (model/flops.py), for the logged MFU
        flops_per_token=train_flops(cfg.model, t.micro_batch_size, L, cfg.model.mem_len, cfg.data.num_predict)
        / (t.micro_batch_size * L),
    )


# ----------------------------------------------------------------------------------------------------------------
# Entry point


def pretrain(
    cfg: Config,
    data_dir: str | Path,
    out_dir: str | Path,
    resume: str | None = None,
    device: str | None = "auto",
    quiet: bool = False,
    stop_after: int | None = None,
    branch: str | Path | None = None,
    rewind: bool = False,
) -> dict:
    """Pretrain (or resume) a run; returns {"step", "loss", "eval", "tokens_per_s", "out", "complete"}.

    ``stop_after``: return after this many optimizer steps of this call (tests, benchmarks); the run is not finished.
    On SIGTERM the run stops after the current step with a checkpoint and raises errors.Preempted (exit code 75).
    Going back to an earlier step (train/lifecycle.py): ``branch`` continues the checkpoint ``resume`` names in that
    new run folder (``out_dir`` kept as it is); ``rewind`` continues it in place, the later steps moved aside.
    """
    data_dir, out_dir = Path(data_dir), Path(out_dir)
    if (branch is not None or rewind) and resume is None:
        flag = "--branch" if branch is not None else "--rewind"
        raise XLNetError(f"{flag} goes with --resume STEP (the step to go on from)")
    if branch is not None and rewind:
        raise XLNetError("--branch and --rewind exclude each other: --branch keeps the run, --rewind changes it")
    target = out_dir if branch is None else Path(branch)
    env = dist.init_distributed(device)
    created_group = env.distributed
    try:
        # SIGTERM while starting unwinds (what was created is removed, the lock released) and exits 75 like a
        # preemption; from the first step on the engine's PreemptionGuard turns it into a checkpoint and a stop
        with sigterm_stops(STARTUP_SIGTERM):
            inputs = [data_dir, cfg.train.init, cfg.train.probe_file, *([out_dir] if branch is not None else [])]
            check_output_not_input(target, inputs, option="--branch" if branch is not None else "output")
            # one writer per run folder (rank 0 holds the lock for all ranks of a torchrun job)
            with output_lock(target) if env.rank == 0 else contextlib.nullcontext():
                if branch is not None:
                    resume = _branch(cfg, data_dir, out_dir, resume, target, env)
                return _pretrain(cfg, data_dir, target, resume, env, quiet, stop_after, rewind)
    finally:
        if created_group:
            dist.cleanup()


def _branch(cfg: Config, data_dir: Path, run_dir: Path, resume: str | None, branch: Path, env: dist.DistEnv) -> str:
    """Make the run folder ``branch`` at the checkpoint of ``run_dir`` that ``resume`` names, every check of a resume
    of ``run_dir`` passed first (nothing is written on a refusal); returns the step to resume ``branch`` from."""
    start = check_run_dir(run_config_checked(cfg, env), run_dir, resume)
    if start is None:
        raise CheckpointError(f"nothing to branch from: {run_dir} holds no checkpoint yet")
    check_records(cfg, records_meta(data_dir), data_dir)
    check_same_records(read_meta(start[1]).get("records"), data_dir, start[1])
    if env.is_main:
        make_branch(run_dir, start, branch)
    dist.barrier()
    return str(start[0])


def run_config_checked(cfg: Config, env: dist.DistEnv) -> Config:
    """``cfg`` with train.precision resolved (as the run's config.yaml holds it), quietly."""
    return run_precision(cfg, "train", env.device, lambda _: None)


def _pretrain(
    cfg: Config,
    data_dir: Path,
    out_dir: Path,
    resume: str | None,
    env: dist.DistEnv,
    quiet: bool,
    stop_after: int | None,
    rewind: bool = False,
) -> dict:
    main = env.is_main
    cfg, meta, accum, start, changed = _check_inputs(
        cfg, data_dir, out_dir, resume, env, printer(main and not quiet), rewind
    )
    if rewind and start is not None:
        verify_checkpoint(start[1])  # a damaged checkpoint is refused before the run is changed
        aside = lifecycle.rewind(out_dir, start[0]) if main else None
        if aside is not None and not quiet:
            printer(main)(f"rewound {out_dir} to step {start[0]}: its later steps and metric rows moved to {aside}")
        dist.barrier()
    init: StartingPoint | None = None
    init_lines: list[str] = []
    init_record: dict | None = None  # meta.json's "init" of every step folder: where the weights started
    if cfg.train.init and start is None:  # a fresh run continuing a checkpoint: its architecture, its other keys
        init, model_cfg, changes = load_init(cfg, data_dir)
        cfg = replace(cfg, model=dataclasses.asdict(model_cfg))
        init_record = init.record()
        init_lines = _init_lines(init, changes, init_record["sha256"])
    else:  # resuming: a continued run's step folders record where it started
        init_record = read_meta(start[1]).get("init") if start else None
        if init_record is not None:
            path, sha = init_record.get("path"), str(init_record.get("sha256"))[:12]
            init_lines = [f"  init       the run started from {path} (weights sha256 {sha})"]
    model = _build_model(cfg, env, init)
    sizes = num_params(model), num_params(model, embedding=False)  # before wrapping (FSDP shards in place)
    say = printer(main and not quiet)
    plan = pretrain_plan(cfg, accum)
    workload = PretrainWorkload(cfg, data_dir, meta, env, accum, say, init_record)
    engine = Engine(model, workload, plan, env, out_dir, cfg, data_dir / "tokenizer", quiet)
    try:
        with _undone_on_failure(out_dir, main, lambda: engine.confirmed_step == 0):
            engine.setup(resume_from=start[1] if start is not None else None, changes=changed)
            return _run(engine, init_lines, sizes, meta, data_dir, stop_after)
    finally:
        workload.stream.close()  # the prefetch thread ends here, not in the interpreter's shutdown


@contextlib.contextmanager
def _undone_on_failure(run_dir: Path, main: bool, before_first_step: Callable[[], bool]) -> Iterator[None]:
    """A start that fails before its first step (a tracker that cannot start, a probe file the step-0 probe refuses,
    ...) leaves the run folder as it found it: what this call created is removed, so the same command can be run
    again (a run killed later, before its first checkpoint, is taken over by a rerun: resume.resume_point)."""
    before = {p.name for p in run_dir.iterdir()} if run_dir.is_dir() else None
    try:
        yield
    except BaseException:
        if main and before_first_step() and run_dir.is_dir() and not step_folders(run_dir):
            doomed = [run_dir] if before is None else [p for p in run_dir.iterdir() if p.name not in before]
            for p in doomed:
                if p.is_dir() and not p.is_symlink():
                    shutil.rmtree(p, ignore_errors=True)
                else:
                    p.unlink(missing_ok=True)
        raise


def _run(
    engine: Engine,
    init_lines: list[str],
    sizes: tuple[int, int],
    meta: dict,
    data_dir: Path,
    stop_after: int | None,
) -> dict:
    """Train the engine (set up) and say so, or report a run already complete."""
    cfg, out_dir, say, main, quiet = engine.cfg, engine.run_dir, engine.say, engine.main, engine.quiet
    t = cfg.train
    if engine.step >= t.max_steps:
        result = engine.fit()  # nothing to train: the run's last logged figures
        say(
            f"run {out_dir} is already complete: step {engine.step} of {t.max_steps}, final checkpoint "
            f"{result['checkpoint']}; nothing to resume (to train further: --resume --set train.max_steps=N, "
            f"N > {t.max_steps})"
        )
        return result

    say_header(engine, sizes, meta, data_dir)
    for line in init_lines:
        say(line)
    result = engine.fit(stop_after)
    if main and result["complete"]:
        result["plot"] = str(maybe_plot(out_dir) or "")
    if main and not quiet and result["complete"]:
        say(
            f"done: {result['step']} steps, last loss {result['loss']:.4f}, {result['tokens_per_s']:,.0f} tokens/s; "
            f"checkpoints in {out_dir}"
        )
    return result


def _check_inputs(
    cfg: Config,
    data_dir: Path,
    out_dir: Path,
    resume: str | None,
    env: dist.DistEnv,
    say: Callable[[str], None],
    rewind: bool = False,
) -> tuple[Config, dict, int, tuple[int, Path] | None, list[tuple[str, Any, Any]]]:
    """Checks before any work: (the config with train.precision resolved, the records' meta, accumulation, the
    checkpoint to resume from or None, the RESUME_CHANGEABLE settings changed against that checkpoint). A resume from
    a step with later step folders needs ``rewind`` (or a branch: train/lifecycle.py)."""
    t = cfg.train
    meta = records_meta(data_dir)
    # the tokenizer every checkpoint carries: the records' copy, the one their shards were encoded with
    check_tokenizer_copy(data_dir, meta.get("tokenizer_sha256"), data_dir / "meta.json", find_shards(data_dir, meta))
    check_records(cfg, meta, data_dir)
    check_config(cfg, env.world_size, stage="pretrain", device=env.device)
    accum = batch_maths(cfg, env.world_size).accumulation
    require_trackers(t.report_to)
    cfg = run_precision(cfg, "train", env.device, say)  # before the resume check: config.yaml holds the value used
    start = check_run_dir(cfg, out_dir, resume)
    changes: list[tuple[str, Any, Any]] = []
    if start is not None:
        later = lifecycle.later_steps(out_dir, start[0])
        if later and not rewind:
            lifecycle.refuse_later_steps(out_dir, start[0], later)
        check_same_records(read_meta(start[1]).get("records"), data_dir, start[1])
        changes = resume_changes(start[1], cfg, RESUME_CHANGEABLE)
        if t.max_steps < start[0]:
            raise XLNetError(
                f"train.max_steps={t.max_steps} is below step {start[0]} of the checkpoint resumed "
                f"({start[1]}); resume with train.max_steps >= {start[0]}"
            )
    return cfg, meta, accum, dist.broadcast_object(start), changes


def records_identity(data_dir: Path) -> dict[str, str]:
    """What a run trains on: the records folder and the sha256 of its meta.json (which lists the sha256 of every
    records file, and the seed, masks and passes they were made with)."""
    if not (data_dir / "meta.json").is_file():
        raise DataError(f"{data_dir} is not a records folder (no meta.json); create it with xlnet preprocess")
    return {"path": str(data_dir.resolve()), "sha256": sha256_file(data_dir / "meta.json")}


def check_same_records(was: Any, data_dir: Path, step_dir: Path) -> None:
    """A resume reads the records the run was trained on (same meta.json, wherever the folder now is); ``was``: the
    checkpoint's record of them (None in checkpoints older than it: not checked)."""
    if not isinstance(was, dict) or "sha256" not in was:
        return
    now = records_identity(data_dir)
    if now["sha256"] != was["sha256"]:
        raise DataError(
            f"{step_dir} was trained on the records {was.get('path')} (meta.json sha256 {str(was['sha256'])[:12]}) "
            f"but --data {data_dir} holds other records ({now['sha256'][:12]}); resume with --data {was.get('path')}, "
            "or start a new run in another --out"
        )


def _build_model(cfg: Config, env: dist.DistEnv, init: StartingPoint | None) -> torch.nn.Module:
    """The same init on every rank (random, or the ``init`` checkpoint's weights); then each rank draws its own dropout
    masks."""
    dist.set_deterministic(cfg.train.deterministic)
    seed_everything(cfg.train.seed)
    model = build_lm_model(cfg)
    if init is not None:
        load_state(model, init.state, where=f"checkpoint {init.path}")
        init.state = {}  # the model holds the weights now
    model = model.to(env.device)
    seed_everything(cfg.train.seed + 7919 * env.rank)
    return model


# ----------------------------------------------------------------------------------------------------------------
# Continued pretraining (train.init, `xlnet pretrain --init`)


def load_init(cfg: Config, data_dir: Path) -> tuple[StartingPoint, ModelConfig, list[str]]:
    """Load ``train.init`` for a fresh run on the records in ``data_dir``: its architecture must be the config's, its
    weights those of an XLNetLMHeadModel of it (``state`` is then in its names), its tokenizer the one the records
    were sharded with (same spiece.model sha256) and as large as its embedding. Also returns the run's model config
    (the checkpoint's architecture, the run's CONTINUE_MUTABLE keys) and its changes against the checkpoint's."""
    assert cfg.train.init is not None
    start = load_starting_point(cfg.train.init)
    model, changes = continued_model_config(start.model, cfg.model, where=f"--init {start.path}")
    start.state = start.lm_weights()  # in XLNetLMHeadModel's names, keys and shapes checked before anything is built
    records_tok = Tokenizer.load(data_dir / "tokenizer")
    if start.tokenizer is not None:
        tok = Tokenizer.load(start.tokenizer)
        if tok.vocab_size != start.model.vocab_size:
            raise CheckpointError(
                f"--init {start.path}: its tokenizer ({start.tokenizer}) has {tok.vocab_size} pieces but the "
                f"model has {start.model.vocab_size} embeddings; the checkpoint is inconsistent"
            )
        if tok.sha256 != records_tok.sha256:
            raise DataError(
                f"records in {data_dir} were sharded with another tokenizer (spiece.model sha256 "
                f"{records_tok.sha256[:12]}) than --init {start.path} has ({tok.sha256[:12]}); shard the corpus "
                f"with the checkpoint's: xlnet shard --tokenizer {start.path} ..., then xlnet preprocess"
            )
    return start, model, changes


def _init_lines(s: StartingPoint, changes: list[str], sha256: str) -> list[str]:
    """The header's lines on where the weights start: the checkpoint, its LM bias, the model keys the run changes."""
    bias = "from the checkpoint" if s.lm_bias else "zeros (the checkpoint has none)"
    lines = [
        f"  init       {s.source} {s.path} (weights sha256 {sha256[:12]}); fresh optimizer, schedule and data",
        f"             LM head tied to the embeddings, its bias {bias}",
    ]
    if changes:
        lines.append(f"             changed from the checkpoint: {', '.join(changes)}")
    if s.tokenizer is None:
        lines.append(
            "             the checkpoint has no SentencePiece model: the records' tokenizer is trusted (same size)"
        )
    return lines
