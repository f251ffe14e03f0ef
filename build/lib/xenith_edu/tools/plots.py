"""The book's figures: one function per figure, so that a chapter shows one call, not the plotting.
Each function draws on a new matplotlib figure and returns it; the notebook calls plt.show().

Shape legend: B batch, S positions, d width, H heads, hd head width, f hidden, V vocab.
"""

from __future__ import annotations

from collections.abc import Mapping

import matplotlib.pyplot as plt
from matplotlib.figure import Figure

# The scalar warm-up of "The rules of backprop": where each node of the graph is drawn,
# (column, row), and which nodes feed which.
_GRAPH_POS = {"x": (0, 2), "w": (0, 1), "b": (0, 0), "u": (1, 1.5), "v": (2, 1),
              "s": (3, 1), "e": (4, 1), "loss": (5, 1)}
_GRAPH_EDGES = (("x", "u"), ("w", "u"), ("u", "v"), ("b", "v"), ("v", "s"), ("s", "e"),
                ("e", "loss"))
_GRAPH_OPS = {"u": r"$u = w x$", "v": r"$v = u + b$", "s": r"$s = \sigma(v)$",
              "e": r"$e = s - T$", "loss": r"$\ell = e^2$"}


def scalar_graph(values: Mapping[str, float], grads: Mapping[str, float]) -> Figure:
    """The computation graph of the scalar warm-up of "The rules of backprop".

    Each node shows its forward value (black, above) and the gradient of the loss with respect
    to it (red, below); the forward pass runs left to right, the backward pass right to left.
    `values` and `grads` are keyed by the node names x, w, b, u, v, s, e, loss.
    """
    fig, ax = plt.subplots(figsize=(8.5, 3.2))
    for a, b in _GRAPH_EDGES:
        (x0, y0), (x1, y1) = _GRAPH_POS[a], _GRAPH_POS[b]
        ax.annotate("", xy=(x1 - 0.18, y1), xytext=(x0 + 0.18, y0),
                    arrowprops=dict(arrowstyle="->", color="0.5", lw=1.2))
    for name, (cx, cy) in _GRAPH_POS.items():
        ax.add_patch(plt.Circle((cx, cy), 0.17, fc="white", ec="black", lw=1.2))
        label = r"$\ell$" if name == "loss" else f"${name}$"
        ax.text(cx, cy, label, ha="center", va="center", fontsize=12)
        ax.text(cx, cy + 0.27, f"{values[name]:.3f}", ha="center", fontsize=9)
        ax.text(cx, cy - 0.36, f"{grads[name]:.3f}", ha="center", fontsize=9,
                color="tab:red")
        if name in _GRAPH_OPS:
            ax.text(cx, -0.75, _GRAPH_OPS[name], ha="center", fontsize=9, color="0.3")
    ax.text(5.45, 2.45, "above a node: its forward value", fontsize=9, ha="right")
    ax.text(5.45, 2.15, "below a node: the gradient of the loss", fontsize=9, ha="right",
            color="tab:red")
    ax.set(xlim=(-0.5, 5.5), ylim=(-1.0, 2.7), aspect="equal")
    ax.axis("off")
    fig.tight_layout()
    return fig

