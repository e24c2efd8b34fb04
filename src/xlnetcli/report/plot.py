"""`xlnet plot RUN_DIR`: loss, learning-rate and throughput curves of a pretraining or finetuning run as a PNG.

Reads the run's metrics.jsonl (rows {"step", "split", ...}). `xlnet plot PROBE_JSON` draws the label-efficiency
curve of an `xlnet probe --train-sizes ... --output PROBE_JSON` result instead (accuracy against labelled examples).
matplotlib is an optional extra (`pip install xlnetcli[plot]`); pretrain and finetune call `maybe_plot` at the end,
which does nothing when it is missing.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

from xlnetcli.core.errors import DataError, XLNetError
from xlnetcli.core.files import atomic_write_bytes, check_file_outputs
from xlnetcli.report.metrics_log import read_metrics, run_inputs

# Metric names, most preferred first, for each panel.
LOSS_KEYS = ("loss", "plm_loss")
EVAL_KEYS = ("loss", "plm_loss", "accuracy", "metric")
THROUGHPUT_KEYS = ("tokens_per_s", "examples_per_s")


def _series(rows: list[dict], split: str, keys: tuple[str, ...]) -> tuple[str, list[int], list[float]] | None:
    for key in keys:
        pts = [(r["step"], r[key]) for r in rows if r.get("split") == split and isinstance(r.get(key), (int, float))]
        if pts:
            return key, [p[0] for p in pts], [float(p[1]) for p in pts]
    return None


def plot_run(run_dir: str | Path, out: str | Path | None = None) -> Path:
    """Write ``RUN_DIR/curves.png`` (or ``out``, in the format its suffix names) and return its path."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise DataError(f"run directory not found: {run_dir}")
    out = Path(out) if out else run_dir / "curves.png"
    check_file_outputs({"--out": out}, run_inputs(run_dir))
    rows = read_metrics(run_dir)
    if not rows:
        raise DataError(f"no metrics in {run_dir} (expected {run_dir / 'metrics.jsonl'} from xlnet pretrain/finetune)")
    plt = _pyplot()
    _image_format(out)
    panels = [
        ("loss", [("train", _series(rows, "train", LOSS_KEYS)), ("eval", _series(rows, "eval", EVAL_KEYS[:2]))]),
        ("learning rate", [("train", _series(rows, "train", ("lr",)))]),
        ("throughput", [("train", _series(rows, "train", THROUGHPUT_KEYS))]),
    ]
    eval_metric = _series(rows, "eval", ("accuracy", "metric", "f1", "pearson"))
    if eval_metric:
        panels.append(("eval " + eval_metric[0], [("eval", eval_metric)]))
    # linear-probe accuracy during pretraining (train.probe_every): when the representation starts to pay off
    probe = [("probe", _series(rows, "probe", (key,))) for key in ("mean", "cls")]
    if any(d for _, d in probe):
        panels.append(("probe accuracy", probe))
    drawn = [(title, [(s, d) for s, d in lines if d is not None]) for title, lines in panels]
    drawn = [p for p in drawn if p[1]]
    fig, axes = plt.subplots(1, len(drawn), figsize=(4.2 * len(drawn), 3.4), squeeze=False)
    for ax, (title, shown) in zip(axes[0], drawn, strict=True):
        for split, (key, steps, values) in shown:
            ax.plot(steps, values, marker="o" if split == "eval" else None, markersize=3, label=f"{split} {key}")
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(run_dir.name, fontsize=10)
    return _save(plt, fig, out)


def plot_label_curve(probe_json: str | Path, out: str | Path | None = None) -> Path:
    """Write the label-efficiency curve of a probe result (``xlnet probe --train-sizes``) to ``out`` (default: the
    JSON's path with .png): validation accuracy against training rows, one line per model and feature."""
    probe_json = Path(probe_json)
    out = Path(out) if out else probe_json.with_suffix(".png")
    check_file_outputs({"--out": out}, [probe_json])
    try:
        res = json.loads(probe_json.read_text(encoding="utf-8"))
        results = res["results"]
        curves = {
            (name, f"{kind} features"): [(pt["n"], pt["accuracy"]) for pt in r["curve"]]
            + [(res["train_examples"], r["accuracy"])]
            for name, feats in results.items()
            for kind, r in feats.items()
        }
        title, majority = f"label efficiency: {Path(res['valid']).name}", res["majority"]
    except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError) as e:
        raise DataError(
            f"{probe_json}: not a probe result with a label-efficiency curve (xlnet probe "
            f"--train-sizes N,N --output FILE): {e}"
        ) from None
    return plot_curves(
        curves,
        out,
        "validation accuracy (linear probe)",
        title,
        majority=majority,
    )


def plot_curves(
    curves: dict[tuple[str, str], list[tuple[int, float]]],
    out: str | Path,
    ylabel: str,
    title: str,
    majority: float | None = None,
) -> Path:
    """Accuracy against labelled examples (log scale) as a PNG: one line per (model, what) key, a colour per
    ``what``, solid for "pretrained" and dashed otherwise; ``majority`` adds the majority-class line."""
    plt = _pyplot()
    _image_format(Path(out))
    fig, ax = plt.subplots(figsize=(5.6, 3.8))
    kinds = list(dict.fromkeys(kind for _, kind in curves))
    for (name, kind), pts in curves.items():
        ax.plot(
            [n for n, _ in pts],
            [a for _, a in pts],
            marker="o",
            markersize=4,
            color=f"C{kinds.index(kind)}",
            linestyle="-" if name == "pretrained" else "--",
            label=f"{name}, {kind}",
        )
    if majority is not None:
        ax.axhline(majority, color="grey", linewidth=0.8, label="majority class")
    ax.set_xscale("log")
    ax.set_xlabel("labelled training examples")
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(title, fontsize=10)
    return _save(plt, fig, Path(out))


def _pyplot():
    try:  # matplotlib is imported only to draw: heavy, and an optional extra
        import matplotlib  # noqa: PLC0415 - heavy, optional extra

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # noqa: PLC0415 - heavy, optional extra; after use("Agg")
    except ImportError:
        raise XLNetError("xlnet plot needs matplotlib: pip install 'xlnetcli[plot]'") from None
    return plt


def _image_format(out: Path) -> str:
    """The format ``out``'s suffix names (png without one); one matplotlib cannot write is refused before drawing."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: PLC0415 - heavy, optional extra

    fmt = out.suffix[1:].lower() or "png"
    formats = FigureCanvasAgg.get_supported_filetypes()
    if fmt not in formats:
        raise XLNetError(
            f"--out {out}: cannot draw a .{fmt} file; name it .png, .pdf or .svg (or {', '.join(sorted(formats))})"
        )
    return fmt


def _save(plt, fig, out: Path) -> Path:
    """Draw in the format of ``out``'s suffix and write it temp-then-rename (atomic_write_bytes), so a failed save
    never leaves a half-written image and a full disk is the one-line disk-full message."""
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format=_image_format(out), dpi=110)
    plt.close(fig)
    atomic_write_bytes(out, buf.getvalue())
    return out


def maybe_plot(run_dir: str | Path) -> Path | None:
    """Plot at the end of a run when matplotlib is installed; never fails the run."""
    try:
        import matplotlib  # noqa: F401, PLC0415 - heavy, optional extra: only whether it is installed
    except ImportError:
        return None
    try:
        return plot_run(run_dir)
    except XLNetError:
        return None
