"""Draw the forward pass of the xenith-edu model and where each chapter's gradient enters.
Writes model_forward.png next to this script (run: python book/figures/make_model_figure.py).

Shape legend: B batch, S positions, N = B*S, d width, H heads, hd head width,
f SwiGLU hidden width, V vocabulary, L layers.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import FancyBboxPatch  # noqa: E402

from xenith_edu import chapters  # noqa: E402

OUT = Path(__file__).with_name("model_forward.png")

# One color per chapter (colorblind-safe Okabe-Ito palette); numbers and titles come from the
# chapter registry, so the badges follow the book's order.
COLOR = {
    "softmax_ce": "#D55E00",
    "swiglu": "#009E73",
    "rmsnorm": "#0072B2",
    "attention": "#CC79A7",
    "rope": "#E69F00",
    "embedding": "#56B4E9",
    "backward": "#555555",
}

# The forward pass, top to bottom: (label, shape after the step, chapter whose gradient enters),
# in the symbols of the book's notation page.
STEPS = [
    (r"tokens $x$", r"$(B, S)$ int", None),
    (r"embedding gather  $h = W_{te}[x]$", r"$(B, S, d)$", "embedding"),
    (r"RMSNorm  $x_b = \mathrm{rmsnorm}(h, w_{attn})$", r"$(B, S, d)$", "rmsnorm"),
    (r"$q, k, v = x_b W_q,\ x_b W_k,\ x_b W_v$", r"$(B, H, S, hd)$", "backward"),
    (r"RoPE on $q$ and $k$", r"$(B, H, S, hd)$", "rope"),
    (r"attention  $P = \mathrm{softmax}(q k^\top / \sqrt{hd} + M)$,  $O = P v$",
     r"$(B, H, S, hd)$", "attention"),
    (r"merge heads of $O$, $\cdot\, W_o$;  $h \leftarrow h + \ldots$", r"$(B, S, d)$",
     "backward"),
    (r"RMSNorm  $x_{2b} = \mathrm{rmsnorm}(h, w_{ffn})$", r"$(B, S, d)$", "rmsnorm"),
    (r"SwiGLU  $(\mathrm{silu}(x_{2b} W_1) \odot x_{2b} W_3)\, W_2$;  $h \leftarrow h + \ldots$",
     r"$(B, S, d)$", "swiglu"),
    (r"final RMSNorm  $x_f = \mathrm{rmsnorm}(h, w_{final})$", r"$(N, d)$", "rmsnorm"),
    (r"logits $z = x_f W_{out}^\top$  ($W_{out} = W_{te}$ when tied)", r"$(N, V)$", "embedding"),
    (r"loss $\ell = $ mean of $-\log \mathrm{softmax}(z)[y]$", "scalar", "softmax_ce"),
]
LAYER = (2, 8)  # first and last step inside the repeated block


def main() -> None:
    fig, ax = plt.subplots(figsize=(9.0, 9.6), dpi=100)
    ax.set_xlim(0, 10)
    n = len(STEPS)
    ax.set_ylim(-2.2, n - 0.4)
    ax.axis("off")

    def y_of(i: int) -> float:
        return n - 1 - i  # first step at the top

    # the repeated block
    top, bottom = y_of(LAYER[0]) + 0.45, y_of(LAYER[1]) - 0.45
    ax.add_patch(FancyBboxPatch((1.6, bottom), 6.95, top - bottom,
                                boxstyle="round,pad=0.05,rounding_size=0.15",
                                fc="#F4F4F4", ec="#999999", lw=1.0, ls="--"))
    ax.text(9.75, (top + bottom) / 2, "repeated for each of the $L$ layers", rotation=-90,
            ha="center", va="center", fontsize=9.5, color="#555555", style="italic")

    for i, (label, shape, chapter) in enumerate(STEPS):
        y = y_of(i)
        color = COLOR[chapter] if chapter else "#BBBBBB"
        ax.add_patch(FancyBboxPatch((1.8, y - 0.3), 6.4, 0.6,
                                    boxstyle="round,pad=0.02,rounding_size=0.1",
                                    fc="white", ec=color, lw=2.0))
        ax.text(5.0, y, label, ha="center", va="center", fontsize=10)
        ax.text(1.45, y, shape, ha="right", va="center", fontsize=8.5, color="#444444")
        if chapter:
            ax.text(8.65, y, f"ch. {chapters.number(chapter)}", ha="left", va="center",
                    fontsize=9.5,
                    color="white", fontweight="bold",
                    bbox={"boxstyle": "round,pad=0.25", "fc": color, "ec": color})
        if i + 1 < n:
            ax.annotate("", xy=(5.0, y - 0.68), xytext=(5.0, y - 0.32),
                        arrowprops={"arrowstyle": "-|>", "color": "#333333", "lw": 1.0})

    # residual stream: h skips the attention and SwiGLU branches
    for start, end in ((2, 6), (7, 8)):
        y0, y1 = y_of(start) + 0.5, y_of(end)
        ax.annotate("", xy=(8.45, y1 + 0.05), xytext=(8.45, y0 - 0.1),
                    arrowprops={"arrowstyle": "-|>", "color": "#888888", "lw": 1.2,
                                "connectionstyle": "arc3,rad=0"})

    # legend: where each chapter's gradient enters
    legend = [(c.slug, f"ch. {chapters.number(c.slug)}: {c.title}") for c in chapters.CHAPTERS
              if c.slug in COLOR]  # the chapters that derive a step's gradient
    per_column = 4
    width = 9.8 / -(-len(legend) // per_column)  # the columns share the figure's width
    for j, (slug, text) in enumerate(legend):
        col, row = divmod(j, per_column)
        ax.text(0.2 + width * col, -1.25 - 0.27 * row, "\u25a0 " + text, fontsize=8.5,
                color=COLOR.get(slug, "#222222"), ha="left", va="center")
    ax.text(0.2, -0.75, "Backward runs bottom to top; each colored badge marks the chapter that "
            "derives the gradient of that step.\nGrey arrows on the right: the residual stream "
            "$h$ skips each branch and is added back.", fontsize=8.5, ha="left", va="center")

    fig.savefig(OUT, dpi=100, bbox_inches="tight", pad_inches=0.1, metadata={"Software": None})
    plt.close(fig)
    print(f"wrote {OUT.name}")


if __name__ == "__main__":
    main()
