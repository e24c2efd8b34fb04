"""Checkpoint step folders.

    run_dir/step_0001000/
        model.safetensors   our state-dict names (model.py), tied LM weight stored once
        config.yaml         the full resolved Config
        tokenizer/          the tokenizer folder (copied): spiece.model, xlnet_tokenizer.json, tokenizer.json, ...
        meta.json           {"kind": "pretrain"|"finetune"|"import", "step": int, ..., "sha256": {file: digest}}
        train_state.safetensors  (`save_tree`) counters, optimizer, grad scaler, task state, per-rank RNG, data cursor,
                                 memories

A training run saves and loads these with a `Checkpointer`: one collection of stateful objects (``state_dict()`` /
``load_state_dict()``), the model to model.safetensors and the rest to train_state.safetensors.

`resolve_checkpoint` accepts a run directory (-> its latest step folder), a step folder, or a Hugging Face XLNet
directory (config.json + model.safetensors / pytorch_model.bin), which `load_model_dir` converts on the fly.

Integrity: meta.json records the sha256 of every other file of the folder; `verify_files` checks them when weights
or a train state are loaded, so a flipped bit is refused with the file's name instead of being trained on. The
files are byte-reproducible (safetensors' header metadata is one fixed key), so two checkpoints compare by hash.
"""

from __future__ import annotations

import json
import re
import shutil
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import torch

from xlnetcli.core import dist
from xlnetcli.config import Config, ModelConfig, config_from_dict, save_config
from xlnetcli.core.errors import CheckpointError, ConfigError, XLNetError
from xlnetcli.core.files import atomic_output_dir, atomic_write_json, is_disk_full, sha256_file

STEP_RE = re.compile(r"^step_(\d{7,})$")
MODEL_FILE = "model.safetensors"
# Keys that define the architecture (a checkpoint cannot be loaded into a model that disagrees on these).
ARCH_KEYS = ("vocab_size", "d_model", "n_layer", "n_head", "d_head", "d_inner", "untie_r", "ff_activation")


def step_dir_name(step: int) -> str:
    return f"step_{step:07d}"


def step_folders(run_dir: str | Path, marker: str = MODEL_FILE) -> list[tuple[int, Path]]:
    """Complete ``step_NNNNNNN`` folders of a run (those holding ``marker``), oldest first; temporary folders of an
    interrupted save never match."""
    run = Path(run_dir)
    if not run.is_dir():
        return []
    found = [(int(m.group(1)), c) for c in run.iterdir() if c.is_dir() and (m := STEP_RE.match(c.name))]
    return sorted((step, c) for step, c in found if (c / marker).is_file())


def save_model_dir(
    out: str | Path,
    model: torch.nn.Module | dict[str, torch.Tensor],
    cfg: Config,
    tokenizer_dir: str | Path | None = None,
    meta: dict[str, Any] | None = None,
    extra_files: dict[str, bytes | str | Path | Callable[[Path], None]] | None = None,
    overwrite: bool = True,
) -> Path:
    """Write a step folder atomically. ``model``: a module or its state dict. ``extra_files`` maps a file name to
    bytes, a source path to copy, or a callable that writes the given path (e.g. ``lambda p: save_tree(state, p)``)."""
    from safetensors.torch import save_file

    if isinstance(model, torch.nn.Module):
        model = getattr(model, "module", model)  # DDP
        model = getattr(model, "_orig_mod", model)  # torch.compile
        model = model.state_dict()
    state = {k: v.detach().contiguous().cpu() for k, v in model.items()}
    out = Path(out)
    # the run folder's owner holds its lock; one key of metadata keeps the header's bytes stable across processes
    with atomic_output_dir(out, overwrite=overwrite, what="a checkpoint", lock=False) as tmp:
        save_file(state, str(tmp / MODEL_FILE), metadata={"format": "pt"})
        save_config(cfg, tmp)
        if tokenizer_dir is not None:
            src = Path(tokenizer_dir)
            if src.is_file():
                src = src.parent
            if not (src / "spiece.model").is_file():
                raise CheckpointError(f"tokenizer directory {src} has no spiece.model")
            shutil.copytree(src, tmp / "tokenizer")
        for name, content in (extra_files or {}).items():
            target = tmp / name
            target.parent.mkdir(parents=True, exist_ok=True)
            if isinstance(content, bytes):
                target.write_bytes(content)
            elif isinstance(content, (str, Path)):
                shutil.copyfile(content, target)
            else:
                content(target)
        digests = {f.relative_to(tmp).as_posix(): sha256_file(f) for f in sorted(tmp.rglob("*")) if f.is_file()}
        atomic_write_json(tmp / "meta.json", {**dict(meta or {}), "sha256": digests})
    return out


def verify_files(folder: str | Path, names: typing.Iterable[str], meta: dict[str, Any] | None = None) -> None:
    """Check files of a checkpoint folder against the sha256 recorded in its meta.json (folders written before
    checksums were recorded pass unchecked)."""
    folder = Path(folder)
    if meta is None:
        meta = read_meta(folder)
    digests = meta.get("sha256") or {}
    for name in names:
        want = digests.get(name)
        if want is None or not (folder / name).is_file():
            continue
        if sha256_file(folder / name) != want:
            raise CheckpointError(f"{folder / name} does not match the checksum in meta.json (corrupted on disk or "
                                  "edited); use another step folder")


def read_meta(folder: str | Path) -> dict[str, Any]:
    path = Path(folder) / "meta.json"
    if not path.is_file():
        return {}
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        raise CheckpointError(f"{path}: not valid JSON") from None
    if not isinstance(meta, dict):
        raise CheckpointError(f"{path}: not a JSON object")
    return meta


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
    from safetensors.torch import save_file

    tensors: dict[str, torch.Tensor] = {}
    tree = json.dumps(_encode(obj, tensors), separators=(",", ":"))
    save_file(tensors, str(path), metadata={"tree": tree})


def load_tree(path: str | Path) -> Any:
    """The object ``save_tree`` wrote; CheckpointError if the file is not one."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            tree = json.loads((f.metadata() or {})["tree"])
            tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 - safe_open has no items()
        return _decode(tree, tensors)
    except (OSError, SafetensorError, ValueError, KeyError, TypeError) as e:
        raise CheckpointError(f"{path} is not a readable training state ({type(e).__name__}); resume from an "
                              "earlier step") from None


TRAIN_STATE = "train_state.safetensors"  # optimizer, scaler, step, RNG states, data cursors (pretrain and finetune)
LEGACY_TRAIN_STATE = "train_state.pt"  # written by earlier versions with torch.save


def has_train_state(folder: Path) -> bool:
    return (folder / TRAIN_STATE).is_file() or (folder / LEGACY_TRAIN_STATE).is_file()


def resumable_steps(run_dir: str | Path) -> list[tuple[int, Path]]:
    """Step folders of a run that can be resumed (with a train state), oldest first."""
    return [(s, p) for s, p in step_folders(run_dir) if has_train_state(p)]


def load_train_state(folder: str | Path) -> dict:
    """A step folder's training state, checked against meta.json's checksum. A legacy ``train_state.pt`` is read
    with ``weights_only=True`` (tensors, numbers, strings and containers only): a pickle that would run code is
    refused."""
    import pickle

    folder = Path(folder)
    if (folder / TRAIN_STATE).is_file():
        verify_files(folder, [TRAIN_STATE])
        return load_tree(folder / TRAIN_STATE)
    path = folder / LEGACY_TRAIN_STATE
    verify_files(folder, [LEGACY_TRAIN_STATE])
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:
        raise CheckpointError(f"{path} holds objects other than tensors and plain values; refusing to unpickle it "
                              "(it was not written by xlnet, and could run code)") from None
    except Exception as e:  # noqa: BLE001 - any other unpickling failure means a corrupt file
        raise CheckpointError(f"{path} is corrupt ({type(e).__name__}); resume from an earlier step") from None


# ----------------------------------------------------------------------------------------------------------------
# The checkpointer: everything a training run keeps across steps, saved and loaded as one collection of stateful
# objects (after torchtitan's checkpointer, whose collection is {model, optimizer, dataloader, lr_scheduler,
# train_state}). The lr schedule is a function of the step (optim.lr_factor), so restoring the step restores it.


class Stateful(Protocol):
    """What the checkpointer saves: ``state_dict()`` returns tensors and plain values in dicts, lists and tuples
    (``save_tree``); ``load_state_dict`` restores the object from what it returned."""

    def state_dict(self) -> Any: ...
    def load_state_dict(self, state: Any) -> None: ...


TRAIN_STATE_FORMAT = 1
MODEL = "model"  # the entry stored in model.safetensors
PROGRESS = "train"  # the entry whose keys (step, tokens_seen, ...) sit at the top of train_state, as format 1 has them


class ModelState:
    """The model's weights: the full state dict (gathered from every rank's shards under FSDP; a collective)."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model

    def state_dict(self) -> dict[str, torch.Tensor]:
        if dist.is_fsdp(self.model):
            from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

            return get_model_state_dict(self.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        return dist.unwrap(self.model).state_dict()

    def load_state_dict(self, state: dict[str, torch.Tensor], where: str = "checkpoint") -> None:
        module = dist.unwrap(self.model)
        if dist.is_fsdp(self.model):
            from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

            check_state_keys(module, state, where)
            set_model_state_dict(self.model, state, options=StateDictOptions(full_state_dict=True))
        else:
            load_state(module, state, where)


class OptimizerState:
    """The optimizer's state; under FSDP the full (unsharded) one, gathered on save and scattered on load."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
        self.model, self.optimizer = model, optimizer

    def _fsdp_options(self, **kwargs: Any) -> Any:
        if not dist.is_fsdp(self.model):
            return None
        from torch.distributed.checkpoint.state_dict import StateDictOptions

        return StateDictOptions(full_state_dict=True, **kwargs)

    def state_dict(self) -> dict:
        opts = self._fsdp_options(cpu_offload=True)
        if opts is None:
            return self.optimizer.state_dict()
        from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

        return get_optimizer_state_dict(self.model, self.optimizer, options=opts)

    def load_state_dict(self, state: dict) -> None:
        opts = self._fsdp_options()
        if opts is None:
            self.optimizer.load_state_dict(state)
            return
        from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict

        set_optimizer_state_dict(self.model, self.optimizer, state, options=opts)


class Checkpointer:
    """Saves and loads a run's collection in step folders of ``run_dir``, and prunes them.

    ``states``: {name: Stateful}, the same on every rank, saved once (rank 0's): ``MODEL`` -> model.safetensors;
    the others -> train_state.safetensors, ``PROGRESS``'s keys at its top level and every other entry under its name.
    ``rank_states``: {name: Stateful} of each rank (RNG states, data cursors, memories), gathered from every rank into
    train_state["ranks"][rank]. So a train_state.safetensors reads::

        {format_version, step, tokens_seen, world_size, accumulation, log_window, optimizer, scaler, [task],
         ranks: [{rng, [data, mems]} for each rank]}

    A save is written to a temporary folder and renamed (save_model_dir); then the last ``keep_last`` resumable
    folders and the ``pinned`` steps stay and every other step folder is removed. A full disk is a one-line error
    naming the last good checkpoint (``resume_hint`` says how to continue from it)."""

    def __init__(self, run_dir: Path, states: dict[str, Stateful], rank_states: dict[str, Stateful], cfg: Config,
                 env: dist.DistEnv, tokenizer_dir: Path | None = None, keep_last: int = 1,
                 resume_hint: str = "--resume {step}") -> None:
        self.run_dir, self.states, self.rank_states, self.cfg, self.env = run_dir, states, rank_states, cfg, env
        self.tokenizer_dir = tokenizer_dir if tokenizer_dir is not None and (tokenizer_dir / "spiece.model").is_file() \
            else None
        self.keep_last, self.resume_hint = keep_last, resume_hint
        self.last_good: Path | None = None  # the latest resumable step folder written or resumed from

    # ---- load ------------------------------------------------------------------------------------------------------

    def load(self, folder: Path) -> None:
        """Restore every entry from step folder ``folder`` (checksums verified). A checkpoint written by another
        number of processes is refused before anything is touched: each rank continues its own state."""
        state = load_train_state(folder)
        written_by = len(state["ranks"])
        if written_by != self.env.world_size:
            raise CheckpointError(
                f"checkpoint {folder.name} was written by {written_by} process(es); resume with the same number "
                f"(torchrun --nproc-per-node {written_by}) for an exact continuation")
        self.states[PROGRESS].load_state_dict(state)
        _, weights, _ = load_model_dir(folder)
        self.states[MODEL].load_state_dict(weights, where=f"checkpoint {folder}")
        for name, obj in self.states.items():
            if name not in (MODEL, PROGRESS):
                obj.load_state_dict(self._entry(state, name, folder))
        mine = state["ranks"][self.env.rank]
        for name, obj in self.rank_states.items():
            obj.load_state_dict(self._entry(mine, name, folder))
        self.last_good = folder

    @staticmethod
    def _entry(state: dict, name: str, folder: Path) -> Any:
        if name not in state:
            raise CheckpointError(f"{folder / TRAIN_STATE} holds no {name!r} state; it was not written by this kind "
                                  "of run: resume from another step folder")
        return state[name]

    # ---- save ------------------------------------------------------------------------------------------------------

    def save(self, step: int, with_state: bool, meta: dict[str, Any], pinned: typing.Iterable[int] = ()) -> Path:
        """Write step folder ``step`` (with train_state.safetensors when ``with_state``) and prune. Every rank calls
        it (the gathers are collectives); rank 0 writes."""
        ranks = dist.all_gather_object({n: s.state_dict() for n, s in self.rank_states.items()}) if with_state else []
        weights = self.states[MODEL].state_dict()
        train_state = None
        if with_state:
            entries = {n: s.state_dict() for n, s in self.states.items() if n != MODEL}
            train_state = {"format_version": TRAIN_STATE_FORMAT, **entries.pop(PROGRESS, {}), **entries,
                           "ranks": ranks}
        path = self.run_dir / step_dir_name(step)
        error = None
        if self.env.is_main:
            try:
                save_model_dir(path, weights, self.cfg, tokenizer_dir=self.tokenizer_dir, meta=meta,
                               extra_files={TRAIN_STATE: lambda p: save_tree(train_state, p)} if with_state else None)
                self.prune(pinned)
            except OSError as e:
                if not is_disk_full(e):
                    raise
                error = (f"disk full while writing checkpoint {path} (the partial folder was removed); "
                         f"{self.last_good_text()}; free space, then continue with --resume")
        error = dist.broadcast_object(error)
        if error:
            raise XLNetError(error)
        dist.barrier()
        if with_state:
            self.last_good = path
        return path

    def prune(self, pinned: typing.Iterable[int] = ()) -> None:
        """Keep the last ``keep_last`` resumable step folders and the ``pinned`` steps; remove the others."""
        resumable = [s for s, _ in resumable_steps(self.run_dir)]
        keep = set(resumable[max(0, len(resumable) - self.keep_last):]) | set(pinned)
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
        return f"last good checkpoint {self.last_good} (resume with {self.resume_hint.format(step=step)})"


def is_hf_dir(path: Path) -> bool:
    return path.is_dir() and (path / "config.json").is_file() and not (path / "config.yaml").is_file()


def resolve_checkpoint(path: str | Path) -> Path:
    """A run directory -> its latest step folder; a step folder or an HF directory -> itself."""
    p = Path(path)
    if not p.exists():
        raise CheckpointError(f"checkpoint not found: {p}")
    if p.is_file():
        if p.name == MODEL_FILE:
            return resolve_checkpoint(p.parent)
        raise CheckpointError(f"{p} is a file; pass a checkpoint folder (step_NNNNNNN) or a run directory")
    if (p / MODEL_FILE).is_file() and (p / "config.yaml").is_file():
        return p
    if is_hf_dir(p):
        return p
    steps = step_folders(p)
    if not steps:
        raise CheckpointError(f"{p} holds no checkpoint (no model.safetensors + config.yaml, no step_* folders)")
    return steps[-1][1]


def load_model_dir(path: str | Path) -> tuple[Config, dict[str, torch.Tensor], dict[str, Any]]:
    """(config, state dict in our names, meta) from a step folder, run directory or HF directory."""
    p = resolve_checkpoint(path)
    if is_hf_dir(p):
        from xlnetcli.checkpoint.hf_dir import load_hf_dir

        return load_hf_dir(p)
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    import yaml

    from xlnetcli.config import yaml_load

    try:
        raw = yaml_load((p / "config.yaml").read_text(encoding="utf-8"))  # no aliases: a bomb cannot expand
        cfg = config_from_dict(raw)
    except (OSError, yaml.YAMLError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{p / 'config.yaml'}: unreadable ({e.__class__.__name__})") from None
    except ConfigError as e:
        raise CheckpointError(f"{p / 'config.yaml'}: {e}") from None
    meta = read_meta(p)
    verify_files(p, [MODEL_FILE], meta)
    try:
        state = load_file(str(p / MODEL_FILE))
    except (OSError, SafetensorError, ValueError) as e:
        raise CheckpointError(f"{p / MODEL_FILE}: corrupt or unreadable ({str(e).splitlines()[0][:120]})") from None
    check_finite(state, p / MODEL_FILE)
    meta.setdefault("path", str(p))
    return cfg, state, meta


def check_finite(state: dict[str, torch.Tensor], where: Path | str) -> None:
    """Refuse weights holding NaN/inf (saved from a diverged run): every later number would be garbage."""
    for key, tensor in state.items():
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            raise CheckpointError(
                f"{where}: non-finite values (NaN/inf) in {key}; the run diverged before this save: "
                "use an earlier step folder"
            )


def check_model_config(found: ModelConfig, expected: ModelConfig, where: str = "checkpoint") -> None:
    """CheckpointError naming both values if the architecture keys disagree."""
    for key in ARCH_KEYS:
        a, b = getattr(found, key), getattr(expected, key)
        if a != b:
            raise CheckpointError(f"{where} has model.{key}={a!r} but the requested config has model.{key}={b!r}")


def load_state(model: torch.nn.Module, state: dict[str, torch.Tensor], where: str = "checkpoint") -> None:
    """Load a state dict strictly, with a one-line error naming the first missing/unexpected/mis-shaped key."""
    check_state_keys(model, state, where)
    model.load_state_dict(state, strict=True)


def check_state_keys(model: torch.nn.Module, state: dict[str, torch.Tensor], where: str = "checkpoint") -> None:
    """CheckpointError naming the first key of ``state`` the model lacks, expects, or shapes differently."""
    own = model.state_dict()
    missing = [k for k in own if k not in state]
    unexpected = [k for k in state if k not in own]
    if missing or unexpected:
        what = f"missing {missing[0]}" if missing else f"unexpected {unexpected[0]}"
        raise CheckpointError(
            f"{where} does not match the model ({len(missing)} missing, {len(unexpected)} unexpected keys; {what})"
        )
    for k, v in state.items():
        if own[k].shape != v.shape:
            raise CheckpointError(f"{where}: {k} has shape {list(v.shape)}, the model expects {list(own[k].shape)}")


def load_lm_model(path: str | Path, device: str | torch.device = "cpu", expect: ModelConfig | None = None,
                  overrides: dict[str, Any] | None = None):
    """(XLNetLMHeadModel in eval mode, Config, meta) from a checkpoint / run dir / HF dir.

    ``expect``: the requested model config; architecture keys must match (CheckpointError names both values).
    ``overrides``: non-architecture model keys to change (dropout, dropatt, mem_len, reuse_len, bi_data, ...)."""
    import dataclasses

    from xlnetcli.config import replace
    from xlnetcli.model import XLNetLMHeadModel

    cfg, state, meta = load_model_dir(path)
    if expect is not None:
        check_model_config(cfg.model, expect, where=f"checkpoint {meta.get('path', path)}")
    if overrides:
        bad = [k for k in overrides if k in ARCH_KEYS]
        if bad:
            raise CheckpointError(f"cannot override architecture key model.{bad[0]} when loading a checkpoint")
        cfg = replace(cfg, model=dict(overrides))
    model = XLNetLMHeadModel(dataclasses.replace(cfg.model))
    if meta.get("kind") == "finetune":  # a finetuned encoder under the tied LM head, bias zero (as transformers does)
        state = {k: v for k, v in state.items() if k.startswith("transformer.")}
        state["lm_bias"] = torch.zeros(cfg.model.vocab_size)
    load_state(model, state, where=f"checkpoint {meta.get('path', path)}")
    model.to(device).eval()
    return model, cfg, meta
