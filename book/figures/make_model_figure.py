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

OUT = Path(__file__).with_name("model_forward.png")

# One color per chapter (colorblind-safe Okabe-Ito palette).
CHAPTER = {
    1: ("softmax cross-entropy", "#D55E00"),
    2: ("SwiGLU", "#009E73"),
    3: ("RMSNorm", "#0072B2"),
    4: ("causal attention", "#CC79A7"),
    5: ("RoPE", "#E69F00"),
    6: ("embedding scatter-add", "#56B4E9"),
    7: ("linear layers, whole backward", "#555555"),
}

# The forward pass, top to bottom: (label, shape after the step, chapter whose gradient enters).
STEPS = [
    (r"tokens $x$", r"$(B, S)$ int", None),
    (r"embedding gather  $h = W_{te}[x]$", r"$(B, S, d)$", 6),
    (r"RMSNorm  $x_b = \mathrm{rmsnorm}(h, w_{attn})$", r"$(B, S, d)$", 3),
    (r"$q, k, v = x_b W_q,\ x_b W_k,\ x_b W_v$", r"$(B, H, S, hd)$", 7),
    (r"RoPE on $q$ and $k$", r"$(B, H, S, hd)$", 5),
    (r"causal attention  $\mathrm{softmax}(q k^\top / \sqrt{hd} + M)\, v$", r"$(B, H, S, hd)$", 4),
    (r"merge heads, $\cdot\, W_o$;  $h \leftarrow h + \ldots$", r"$(B, S, d)$", 7),
    (r"RMSNorm  $x_{2b} = \mathrm{rmsnorm}(h, w_{ffn})$", r"$(B, S, d)$", 3),
    (r"SwiGLU  $(\mathrm{silu}(x_{2b} W_1) \odot x_{2b} W_3)\, W_2$;  $h \leftarrow h + \ldots$",
     r"$(B, S, d)$", 2),
    (r"final RMSNorm  $x_f = \mathrm{rmsnorm}(h, w_{final})$", r"$(N, d)$", 3),
    (r"logits $= x_f W_{te}^\top$  (tied) or $x_f W_{head}^\top$", r"$(N, V)$", 6),
    (r"loss $= $ mean of $-\log \mathrm{softmax}(\mathrm{logits})[y]$", "scalar", 1),
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
        color = CHAPTER[chapter][1] if chapter else "#BBBBBB"
        ax.add_patch(FancyBboxPatch((1.8, y - 0.3), 6.4, 0.6,
                                    boxstyle="round,pad=0.02,rounding_size=0.1",
                                    fc="white", ec=color, lw=2.0))
        ax.text(5.0, y, label, ha="center", va="center", fontsize=10)
        ax.text(1.45, y, shape, ha="right", va="center", fontsize=8.5, color="#444444")
        if chapter:
            ax.text(8.65, y, f"ch. {chapter}", ha="left", va="center", fontsize=9.5,
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
    lines = [f"ch. {k}: {name}" for k, (name, _) in CHAPTER.items()]
    lines.append("ch. 8: training (AdamW, the loop)")
    for j, text in enumerate(lines):
        col, row = divmod(j, 4)
        color = CHAPTER.get(j + 1, ("", "#222222"))[1]
        ax.text(0.2 + 4.9 * col, -1.25 - 0.27 * row, "\u25a0 " + text, fontsize=8.5,
                color=color, ha="left", va="center")
    ax.text(0.2, -0.75, "Backward runs bottom to top; each colored badge marks the chapter that "
            "derives the gradient of that step.\nGrey arrows on the right: the residual stream "
            "$h$ skips each branch and is added back.", fontsize=8.5, ha="left", va="center")

    fig.savefig(OUT, dpi=100, bbox_inches="tight", pad_inches=0.1, metadata={"Software": None})
    plt.close(fig)
    print(f"wrote {OUT.name}")


if __name__ == "__main__":
    main()
