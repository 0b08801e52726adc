"""The loss plot the seed draws, as PNG bytes: raw points, a moving average, eval loss, a status title."""

from __future__ import annotations

import io
from typing import Any

import matplotlib

matplotlib.use("Agg")
from matplotlib.figure import Figure

THEMES = {
    "light": {"bg": "#ffffff", "fg": "#1f2328", "grid": "#d0d7de", "raw": "#9ecae1", "avg": "#1f6feb",
              "eval": "#d29922"},
    "dark": {"bg": "#0d1117", "fg": "#e6edf3", "grid": "#30363d", "raw": "#355d85", "avg": "#58a6ff",
             "eval": "#e3b341"},
}


def moving_average(values: list[float], window: int) -> list[float]:
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out


def loss_plot(records: list[dict[str, Any]], status: str, theme: str = "light") -> bytes:
    colours = THEMES[theme]
    fig = Figure(figsize=(8, 4.5), dpi=100, facecolor=colours["bg"])
    ax = fig.add_subplot()
    ax.set_facecolor(colours["bg"])
    for spine in ax.spines.values():
        spine.set_color(colours["grid"])
    ax.tick_params(colors=colours["fg"])
    ax.grid(True, color=colours["grid"], linewidth=0.6, alpha=0.7)
    train = [(r["step"], r["loss"]) for r in records if r.get("loss") is not None]
    evals = [(r["step"], r["eval_loss"]) for r in records if r.get("eval_loss") is not None]
    if not train and not evals:
        ax.text(0.5, 0.5, "No training data yet", ha="center", va="center", color=colours["fg"],
                fontsize=14, transform=ax.transAxes)
        ax.set_xticks([])
        ax.set_yticks([])
    if train:
        steps, losses = zip(*train, strict=True)
        ax.plot(steps, losses, color=colours["raw"], linewidth=1, alpha=0.8, label="loss")
        window = max(1, len(losses) // 20)
        ax.plot(steps, moving_average(list(losses), window), color=colours["avg"], linewidth=2,
                label=f"moving average ({window})")
    if evals:
        steps, losses = zip(*evals, strict=True)
        ax.plot(steps, losses, "o-", color=colours["eval"], linewidth=1.5, markersize=4, label="eval loss")
    if train or evals:
        ax.set_xlabel("step", color=colours["fg"])
        ax.set_ylabel("loss", color=colours["fg"])
        legend = ax.legend(facecolor=colours["bg"], edgecolor=colours["grid"])
        for text in legend.get_texts():
            text.set_color(colours["fg"])
    ax.set_title(f"Training loss — {status}", color=colours["fg"])
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", facecolor=colours["bg"])
    return buffer.getvalue()
