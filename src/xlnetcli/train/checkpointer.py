"""The training state and the checkpointer: what a run keeps across steps, in its step folders.

    run_dir/step_0001000/
        model.safetensors        the model (checkpoint/folders.py writes the folder: config.yaml, tokenizer/, meta.json)
        train_state.safetensors  (`save_tree`) counters, optimizer, grad scaler, task state, per-rank RNG, data cursor,
                                 memories (by records row)

A training run saves and loads these with a `Checkpointer`: one collection of stateful objects (``state_dict()`` /
``load_state_dict()``), the model to model.safetensors and the rest to train_state.safetensors.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, cast

import torch
from safetensors import SafetensorError, safe_open

from xlnetcli.checkpoint.folders import save_model_dir, step_dir_name, step_folders, verify_checkpoint
from xlnetcli.checkpoint.load import check_state_keys, load_state, load_step_folder
from xlnetcli.config import Config
from xlnetcli.core import dist
from xlnetcli.core.errors import CheckpointError, DiskFull, XLNetError
from xlnetcli.core.files import is_disk_full, save_safetensors
from xlnetcli.core.shapes import describe, json_field

# ----------------------------------------------------------------------------------------------------------------
# Training state without pickle: tensors in a safetensors file, the structure around them as JSON in its header.
# Loading runs no code (unlike torch.load of a pickle), and the bytes depend only on the values (torch.save writes a
# random serialization id), so an interrupted-and-resumed run's state hashes like an uninterrupted one's.


def _encode(x: Any, tensors: dict[str, torch.Tensor]) -> Any:
    if isinstance(x, torch.Tensor):
        key = f"t{len(tensors):06d}"
        tensors[key] = x.detach().to("cpu").contiguous().clone()
        return {"tensor": key}
    if isinstance(x, dict):
        return {"dict": [[_encode(k, tensors), _encode(v, tensors)] for k, v in x.items()]}
    if isinstance(x, tuple):
        return {"tuple": [_encode(v, tensors) for v in x]}
    if isinstance(x, list):
        return [_encode(v, tensors) for v in x]
    if x is None or isinstance(x, (bool, int, float, str)):
        return x
    raise TypeError(f"cannot store a {type(x).__name__} in a training state")


def _decode(x: Any, tensors: dict[str, torch.Tensor]) -> Any:
    if isinstance(x, list):
        return [_decode(v, tensors) for v in x]
    if isinstance(x, dict):
        if "tensor" in x:
            return tensors[x["tensor"]]
        if "tuple" in x:
            return tuple(_decode(v, tensors) for v in x["tuple"])
        return {_decode(k, tensors): _decode(v, tensors) for k, v in x["dict"]}
    return x


def save_tree(obj: Any, path: str | Path) -> None:
    """Nested dicts/lists/tuples of tensors, numbers, strings and None -> one safetensors file."""
    tensors: dict[str, torch.Tensor] = {}
    tree = json.dumps(_encode(obj, tensors), separators=(",", ":"))
    save_safetensors(tensors, path, metadata={"tree": tree})


def load_tree(path: str | Path) -> Any:
    """The object ``save_tree`` wrote; CheckpointError if the file is not one."""
    try:
        with safe_open(str(path), framework="pt") as f:
            tree = json.loads((f.metadata() or {})["tree"])
            tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 - safe_open has no items()
        return _decode(tree, tensors)
    except (OSError, SafetensorError, ValueError, KeyError, TypeError, RecursionError) as e:
        raise CheckpointError(
            f"{path} is not a readable training state ({type(e).__name__}); resume from an earlier step"
        ) from None


TRAIN_STATE = "train_state.safetensors"  # optimizer, scaler, step, RNG states, data cursors (pretrain and finetune)
PICKLED_TRAIN_STATE = "train_state.pt"  # a torch.save pickle: never read (unpickling can run code), refused


def has_train_state(folder: Path) -> bool:
    """True when a step folder holds a train state (a pickled one counts, so that resuming from it is refused)."""
    return (folder / TRAIN_STATE).is_file() or (folder / PICKLED_TRAIN_STATE).is_file()


def resumable_steps(run_dir: str | Path) -> list[tuple[int, Path]]:
    """Step folders of a run that can be resumed (with a train state), oldest first."""
    return [(s, p) for s, p in step_folders(run_dir) if has_train_state(p)]


def load_train_state(folder: str | Path, verified: bool = False) -> dict:
    """A step folder's training state, every file of the folder checked against meta.json's checksums first (unless
    the caller has: ``verified``). A pickled ``train_state.pt`` is refused without being opened."""
    folder = Path(folder)
    if not (folder / TRAIN_STATE).is_file() and (folder / PICKLED_TRAIN_STATE).is_file():
        raise CheckpointError(
            f"{folder / PICKLED_TRAIN_STATE} is a pickle; refusing to unpickle it (it could run "
            f"code): xlnet reads a training state only from {TRAIN_STATE}"
        )
    if not verified:
        verify_checkpoint(folder)
    return load_tree(folder / TRAIN_STATE)


def _check_state_shape(state: Any, where: Path) -> None:
    """The top of a train state: an object with its step and one object per rank; one line naming the field else."""
    if not isinstance(state, dict):
        raise CheckpointError(f"{where}: not a training state (found {describe(state)}); resume from an earlier step")
    version = json_field(state, "format_version", int, where, CheckpointError, lo=1, default=1)
    if version > TRAIN_STATE_FORMAT:
        raise CheckpointError(
            f"{where}: training state format {version} is newer than this xlnet reads ({TRAIN_STATE_FORMAT}); "
            "upgrade xlnetcli"
        )
    json_field(state, "step", int, where, CheckpointError, lo=0)
    json_field(state, "accumulation", int, where, CheckpointError, lo=1, default=1)
    ranks = json_field(state, "ranks", list, where, CheckpointError)
    if not ranks or not all(isinstance(r, dict) for r in ranks):
        raise CheckpointError(f"{where}: field 'ranks' must be a non-empty list of objects; resume from another step")


# ----------------------------------------------------------------------------------------------------------------
# The checkpointer: everything a training run keeps across steps, saved and loaded as one collection of stateful
# objects (after torchtitan's checkpointer, whose collection is {model, optimizer, dataloader, lr_scheduler,
# train_state}). The lr schedule is a function of the step (optim.lr_factor), so restoring the step restores it.


class Stateful(Protocol):
    """What the checkpointer saves: ``state_dict()`` returns tensors and plain values in dicts, lists and tuples
    (``save_tree``); ``load_state_dict`` restores the object from what it returned."""

    def state_dict(self) -> Any: ...
    def load_state_dict(self, state: Any) -> None: ...


class Reassignable(Stateful, Protocol):
    """A rank's state that a run with another layout (number of processes, micro-batch size) can continue:
    ``load_state_dicts`` gets the states of every rank of the saving run, in rank order, and takes its share."""

    def load_state_dicts(self, states: list[Any]) -> None: ...


# 2: memories keyed by records row ({"rows", "layers"}), not by micro-batch index; format 1 is still read
TRAIN_STATE_FORMAT = 2
MODEL = "model"  # the entry stored in model.safetensors
PROGRESS = "train"  # the entry whose keys (step, tokens_seen, ...) sit at the top of train_state, as format 1 has them


def _fsdp_state_dict() -> Any:
    """torch.distributed.checkpoint.state_dict (full state dicts of a sharded model and its optimizer). Imported on
    first use: it adds ~1.5 s to every start, and only FSDP runs need it."""
    import torch.distributed.checkpoint.state_dict as fsdp_state_dict  # noqa: PLC0415 - heavy (~1.5 s), only FSDP runs need it

    return fsdp_state_dict


class ModelState:
    """The model's weights: the full state dict (gathered from every rank's shards under FSDP; a collective)."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model

    def state_dict(self) -> dict[str, torch.Tensor]:
        if dist.is_fsdp(self.model):
            sd = _fsdp_state_dict()
            return sd.get_model_state_dict(
                self.model, options=sd.StateDictOptions(full_state_dict=True, cpu_offload=True)
            )
        return dist.unwrap(self.model).state_dict()

    def load_state_dict(self, state: dict[str, torch.Tensor], where: str = "checkpoint") -> None:
        module = dist.unwrap(self.model)
        if dist.is_fsdp(self.model):
            sd = _fsdp_state_dict()
            check_state_keys(module, state, where)
            sd.set_model_state_dict(self.model, state, options=sd.StateDictOptions(full_state_dict=True))
        else:
            load_state(module, state, where)


class OptimizerState:
    """The optimizer's state; under FSDP the full (unsharded) one, gathered on save and scattered on load. A plain or
    DDP run keys it by parameter index, an FSDP run by parameter name (torch.distributed.checkpoint): either loads into
    either, so a run resumes on any number of processes and under either wrapper."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
        self.model, self.optimizer = model, optimizer

    def state_dict(self) -> dict:
        if not dist.is_fsdp(self.model):
            return self.optimizer.state_dict()
        sd = _fsdp_state_dict()
        return sd.get_optimizer_state_dict(
            self.model, self.optimizer, options=sd.StateDictOptions(full_state_dict=True, cpu_offload=True)
        )

    def load_state_dict(self, state: dict) -> None:
        by_name = any(isinstance(i, str) for g in state.get("param_groups", []) for i in g.get("params", []))
        if not by_name and not dist.is_fsdp(self.model):
            self.optimizer.load_state_dict(state)
            return
        sd = _fsdp_state_dict()
        if not by_name:  # by index, onto a sharded model: the names of the optimizer's parameters, in its order
            groups = sd.get_optimizer_state_dict(self.model, self.optimizer)["param_groups"]
            names = [n for g in groups for n in g["params"]]
            state = {
                "state": {names[i]: v for i, v in state["state"].items()},
                "param_groups": [{**g, "params": [names[i] for i in g["params"]]} for g in state["param_groups"]],
            }
        sd.set_optimizer_state_dict(
            self.model, self.optimizer, state, options=sd.StateDictOptions(full_state_dict=True)
        )


@dataclass(frozen=True)
class ResumePolicy:
    """How a run's checkpoints are kept and resumed: the last ``keep_last`` resumable step folders stay; ``hint`` tells
    the user how to continue from step {step}; ``elastic``: a checkpoint of another layout (processes, accumulation)
    resumes, every rank state then ``Reassignable`` (pretraining: rows are the unit)."""

    keep_last: int = 1
    hint: str = "--resume {step}"
    elastic: bool = False


class Checkpointer:
    """Saves and loads a run's collection in step folders of ``run_dir``, and prunes them.

    ``states``: {name: Stateful}, the same on every rank, saved once (rank 0's): ``MODEL`` -> model.safetensors;
    the others -> train_state.safetensors, ``PROGRESS``'s keys at its top level and every other entry under its name.
    ``rank_states``: {name: Stateful} of each rank (RNG states, data cursors, memories), gathered from every rank into
    train_state["ranks"][rank]. A checkpoint of another layout (processes, ``accumulation``) is refused unless the
    ``policy`` is elastic. So a train_state.safetensors reads::

        {format_version, step, tokens_seen, world_size, accumulation, log_window, optimizer, scaler, [task],
         ranks: [{rng, [data, mems]} for each rank]}

    A save is written to a temporary folder and renamed (save_model_dir); then the policy's last ``keep_last``
    resumable folders and the ``pinned`` steps stay and every other step folder is removed. A full disk is a one-line
    error naming the last good checkpoint (the policy's ``hint`` says how to continue from it)."""

    def __init__(
        self,
        run_dir: Path,
        states: dict[str, Stateful],
        rank_states: dict[str, Stateful],
        cfg: Config,
        env: dist.DistEnv,
        tokenizer_dir: Path | None = None,
        accumulation: int = 1,
        policy: ResumePolicy = ResumePolicy(),
    ) -> None:
        self.run_dir, self.states, self.rank_states, self.cfg, self.env = run_dir, states, rank_states, cfg, env
        self.layout, self.policy = (env.world_size, accumulation), policy
        self.resumed_layout: tuple[int, int] | None = None  # (processes, accumulation) of a checkpoint re-assigned
        self.tokenizer_dir = (
            tokenizer_dir if tokenizer_dir is not None and (tokenizer_dir / "spiece.model").is_file() else None
        )
        self.last_good: Path | None = None  # the latest resumable step folder written or resumed from

    # ---- load ------------------------------------------------------------------------------------------------------

    def load(self, folder: Path) -> None:
        """Restore every entry from step folder ``folder`` (checksums verified). The model and optimizer are full
        state dicts, loadable on any number of processes. Each rank continues its own rank state when the layout is
        the same; else an elastic run's rank states are re-assigned from every rank's (``Reassignable``) and
        ``resumed_layout`` says so, and a non-elastic run's checkpoint is refused before anything is touched."""
        _, weights, _ = load_step_folder(folder)  # every file of the folder checked against meta.json
        state = load_train_state(folder, verified=True)
        _check_state_shape(state, folder / TRAIN_STATE)
        saved = (len(state["ranks"]), state.get("accumulation", self.layout[1]))
        same = saved == self.layout
        if not same and not self.policy.elastic:
            raise CheckpointError(
                f"checkpoint {folder.name} was written by {saved[0]} process(es) with accumulation {saved[1]}, this "
                f"run has {self.layout[0]} with {self.layout[1]}; resume with the same number (torchrun "
                f"--nproc-per-node {saved[0]}) and micro-batch size for an exact continuation"
            )
        self.states[PROGRESS].load_state_dict(state)
        model = self.states[MODEL]
        assert isinstance(model, ModelState)  # the engine always registers the model as a ModelState
        model.load_state_dict(weights, where=f"checkpoint {folder}")
        for name, obj in self.states.items():
            if name not in (MODEL, PROGRESS):
                obj.load_state_dict(self._entry(state, name, folder))
        ranks = state["ranks"]
        for name, obj in self.rank_states.items():
            if same:
                obj.load_state_dict(self._entry(ranks[self.env.rank], name, folder))
            else:
                cast(Reassignable, obj).load_state_dicts([self._entry(r, name, folder) for r in ranks])
        self.resumed_layout = None if same else saved
        self.last_good = folder

    @staticmethod
    def _entry(state: dict, name: str, folder: Path) -> Any:
        if name not in state:
            raise CheckpointError(
                f"{folder / TRAIN_STATE} holds no {name!r} state; it was not written by this kind "
                "of run: resume from another step folder"
            )
        return state[name]

    # ---- save ------------------------------------------------------------------------------------------------------

    def save(self, step: int, with_state: bool, meta: dict[str, Any], pinned: Iterable[int] = ()) -> Path:
        """Write step folder ``step`` (with train_state.safetensors when ``with_state``) and prune. Every rank calls
        it (the gathers are collectives); rank 0 writes."""
        ranks = dist.all_gather_object({n: s.state_dict() for n, s in self.rank_states.items()}) if with_state else []
        weights = self.states[MODEL].state_dict()
        train_state = None
        if with_state:
            entries = {n: s.state_dict() for n, s in self.states.items() if n != MODEL}
            train_state = {"format_version": TRAIN_STATE_FORMAT, **entries.pop(PROGRESS, {}), **entries, "ranks": ranks}
        path = self.run_dir / step_dir_name(step)
        error = None
        if self.env.is_main:
            try:
                save_model_dir(
                    path,
                    weights,
                    self.cfg,
                    tokenizer_dir=self.tokenizer_dir,
                    meta=meta,
                    extra_files={TRAIN_STATE: lambda p: save_tree(train_state, p)} if with_state else None,
                )
                self.prune(pinned)
            except (OSError, DiskFull) as e:
                if not is_disk_full(e):
                    raise
                error = (
                    f"disk full while writing checkpoint {path} (the partial folder was removed); "
                    f"{self.last_good_text()}; free space, then continue with --resume"
                )
        error = dist.broadcast_object(error)
        if error:
            raise XLNetError(error)
        dist.barrier()
        if with_state:
            self.last_good = path
        return path

    def prune(self, pinned: Iterable[int] = ()) -> None:
        """Keep the last ``keep_last`` resumable step folders and the ``pinned`` steps; remove the others."""
        resumable = [s for s, _ in resumable_steps(self.run_dir)]
        keep = set(resumable[max(0, len(resumable) - self.policy.keep_last) :]) | set(pinned)
        for s, path in step_folders(self.run_dir):
            if s not in keep:
                shutil.rmtree(path, ignore_errors=True)

    def remove_stale_temp(self) -> None:
        """Temporary folders of a save that was killed half-way (rank 0, before the first save)."""
        for p in [*self.run_dir.glob(".step_*"), *self.run_dir.glob(".train_state.*")]:
            if p.is_dir():
                shutil.rmtree(p, ignore_errors=True)

    def last_good_text(self) -> str:
        if self.last_good is None:
            return "no checkpoint saved yet"
        step = int(self.last_good.name.split("_")[1])
        return f"last good checkpoint {self.last_good} (resume with {self.policy.hint.format(step=step)})"
