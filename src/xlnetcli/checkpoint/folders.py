"""Step folders: their names, writing one atomically with the checksums of its files, and checking them; the
tokenizer a checkpoint, run, shards or records folder carries (tokenizer_dir_of, find_tokenizer).

Integrity: meta.json records the sha256 of every other file of the folder; `verify_checkpoint` checks them all
whenever a checkpoint is loaded (eval, export, --init, resume), so a flipped bit, an edited config.yaml or a swapped
spiece.model is refused with the file's name instead of being used. The
files are byte-reproducible (safetensors' header metadata is one fixed key), so two checkpoints compare by hash.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Callable, Iterable
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

from xlnetcli.config import Config, save_config
from xlnetcli.core.errors import CheckpointError, DataError
from xlnetcli.core.files import atomic_output_dir, atomic_write_json, save_safetensors, sha256_file
from xlnetcli.core.shapes import read_json_object, str_map
from xlnetcli.data.tokenizer import HF_FILE, HF_SPM_FILE, SPIECE_FILE

if TYPE_CHECKING:  # torch takes a second to import: `xlnet tokenize` and `shard` find tokenizers here without it
    import torch

STEP_RE = re.compile(r"^step_(\d{7,})$")
MODEL_FILE = "model.safetensors"
# listed in meta.json but removed on purpose later: a finished finetuning run drops its best folder's train state
DROPPABLE = frozenset({"train_state.safetensors"})


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
    import torch  # noqa: PLC0415 - a second to import; find_tokenizer (tokenize, shard) does without it

    if isinstance(model, torch.nn.Module):
        model = getattr(model, "module", model)  # DDP
        model = getattr(model, "_orig_mod", model)  # torch.compile
        model = model.state_dict()
    state = {k: v.detach().contiguous().cpu() for k, v in model.items()}
    out = Path(out)
    # the run folder's owner holds its lock; one key of metadata keeps the header's bytes stable across processes
    with atomic_output_dir(out, overwrite=overwrite, what="a checkpoint", lock=False) as tmp:
        save_safetensors(state, tmp / MODEL_FILE, metadata={"format": "pt"})
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


def verify_files(folder: str | Path, names: Iterable[str] | None = None, meta: dict[str, Any] | None = None) -> None:
    """Check files of a checkpoint folder against the sha256 recorded in its meta.json: ``names`` (a file without a
    recorded checksum is not checked), or with None every file meta.json lists (a listed file that is gone is
    refused, but for the train state a finished run drops: ``DROPPABLE``). ``meta``: the folder's meta.json when the
    caller has read it."""
    folder = Path(folder)
    if meta is None:
        meta = read_meta(folder)
    digests = str_map(meta, "sha256", folder / "meta.json", CheckpointError) if "sha256" in meta else {}
    for name in digests if names is None else names:
        want = digests.get(name)
        if want is None:
            continue
        path = _listed_file(folder, name)
        if path is None:
            if names is None and name not in DROPPABLE:
                raise CheckpointError(
                    f"{folder / name} is listed in meta.json but missing; the folder is incomplete: use another step "
                    "folder"
                )
            continue
        if sha256_file(path) != want:
            raise CheckpointError(
                f"{path} does not match the checksum in meta.json (corrupted on disk or "
                "edited); use another step folder"
            )


def _listed_file(folder: Path, name: str) -> Path | None:
    """The regular file ``name`` of meta.json's checksums names inside ``folder`` (None when absent). A name that
    leaves the folder or is not a regular file is refused: reading it could hang (a fifo, /dev/zero)."""
    rel = PurePosixPath(name)
    if rel.is_absolute() or ".." in rel.parts or not rel.parts:
        raise CheckpointError(f"{folder / 'meta.json'}: field 'sha256' names {name!r}, a path outside the folder")
    path = folder.joinpath(*rel.parts)
    if not path.exists() and not path.is_symlink():
        return None
    if not path.is_file() or folder.resolve() not in path.resolve().parents:
        raise CheckpointError(f"{path} is not a regular file of {folder}; use another step folder")
    return path


def verify_checkpoint(folder: str | Path) -> dict[str, Any]:
    """One of our step folders checked whole: its meta.json read and every file it lists compared with its sha256.
    A folder without meta.json, or whose meta.json lost its checksums, is refused: nothing in it can be trusted."""
    folder = Path(folder)
    way_out = (
        "xlnet writes one into every step folder, so this one is damaged or was assembled by hand: use another step "
        "folder of the run, or pass weights from elsewhere as a Hugging Face directory (config.json + "
        "model.safetensors)"
    )
    if not (folder / "meta.json").is_file():
        raise CheckpointError(f"{folder} has no meta.json, so its files cannot be checked; {way_out}")
    meta = read_meta(folder)
    if not meta.get("sha256"):
        raise CheckpointError(f"{folder / 'meta.json'} lists no checksums (field 'sha256'); {way_out}")
    verify_files(folder, None, meta)
    return meta


def read_meta(folder: str | Path) -> dict[str, Any]:
    """A checkpoint folder's meta.json ({} when it has none); CheckpointError when it is not a JSON object."""
    path = Path(folder) / "meta.json"
    if not path.is_file():
        return {}
    return read_json_object(path, CheckpointError, "a step folder's meta.json")


def tokenizer_dir_of(ckpt: Path) -> Path:
    """The tokenizer that belongs to a checkpoint folder (our tokenizer/ or an HF directory's spiece.model)."""
    if (ckpt / "tokenizer" / "spiece.model").is_file():
        return ckpt / "tokenizer"
    if (ckpt / "spiece.model").is_file():
        return ckpt
    raise CheckpointError(f"{ckpt} has no tokenizer (expected tokenizer/spiece.model or spiece.model)")


def find_tokenizer(path: str | Path) -> Path:
    """The tokenizer a path names, for Tokenizer.load (`xlnet shard --tokenizer`, `tokenize encode --tokenizer`):
    a SentencePiece model file as given; a folder holding spiece.model (ours, or a transformers XLNet directory) or
    tokenizer/spiece.model (a step folder, shards, records), as tokenizer_dir_of; a run: its latest step folder's
    (resolve_checkpoint's rule); a transformers 5 directory: the tokenizer.model its save_vocabulary writes.
    DataError naming what was expected otherwise."""
    p = Path(path)
    if not p.exists():
        raise DataError(f"tokenizer {p} does not exist; train one with `xlnet tokenize train`")
    if p.is_file():
        return p
    if (p / SPIECE_FILE).is_file() or (p / "tokenizer" / SPIECE_FILE).is_file():
        return tokenizer_dir_of(p)
    if steps := step_folders(p):
        return tokenizer_dir_of(steps[-1][1])
    if (p / HF_SPM_FILE).is_file():
        return p / HF_SPM_FILE
    hint = ""
    if (p / HF_FILE).is_file():  # transformers 5's XLNetTokenizer.save_pretrained writes tokenizer.json alone
        hint = f"; its {HF_FILE} holds no SentencePiece model: copy the model's {SPIECE_FILE} beside it"
    raise DataError(
        f"{p} holds no tokenizer: expected {SPIECE_FILE} (a tokenizer folder or a transformers XLNet directory), "
        f"tokenizer/{SPIECE_FILE} (a step folder, shards or records) or step_* folders (a run){hint}"
    )
