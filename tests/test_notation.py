"""One notation: the symbol table of book/notation.md is the single source, the glossary agrees
with it, and no page (prose, notebook markdown, figure label) uses a spelling it replaced."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MATH = re.compile(r"\$\$(.+?)\$\$|\$(.+?)\$", re.S)
# a fenced block of code or a shell session: no math is rendered there ("$ ls" is a prompt)
CODE_FENCE = re.compile(r"^```(?!\{math).*?^```", re.S | re.M)
NOT_NAME = r"(?<![A-Za-z\\_^{])"  # a bare letter: not part of a word, command or sub/superscript
END = r"(?![A-Za-z])"

# Spellings the book replaced, forbidden in the math of every page: (pattern, what to write).
FORBIDDEN = [
    (r"W_\{?\\?(?:text|mathrm)?\{?head", "the output projection is W_{out}"),
    (r"\\epsilon(?![a-z])", "write \\varepsilon (RMSNorm), \\varepsilon_{adam} (AdamW) or "
                            "\\varepsilon_{mach} (machine epsilon)"),
    (r"g_\{?\\?(?:text|mathrm)?\{?(?:final|attn|ffn)", "the RMSNorm gains are w_{final}, "
                                                      "w_{attn}, w_{ffn}; g is a gradient"),
    (r"p\s*-\s*Y" + END, "the one-hot targets are T: dz = (p - T) / N"),
    (NOT_NAME + r"A" + END, "the attention weights are P"),
    (NOT_NAME + r"h\s*=\s*10\^", "the finite-difference step is \\delta, h is the residual stream"),
    (NOT_NAME + r"2\s*h" + END, "the finite-difference step is \\delta (2\\delta)"),
    (r"\\pm\s*h" + END, "the finite-difference step is \\delta (\\pm \\delta)"),
    (NOT_NAME + r"h\^\{?[2-5]", "the finite-difference step is \\delta (\\delta^2)"),
    (r"D_i\(h\)|\(\\theta\s*[+-]\s*h\b", "the finite-difference step is \\delta"),
    (r"\(b,\s*h\)", "a head is c: the pairs are (b, c)"),
    (NOT_NAME + r"a_m" + END, "the merged attention output is O_m"),
    (NOT_NAME + r"s\s*=\s*q\s*k", "the attention scores are Z"),
]
# Spellings forbidden only on some pages: {page stem: [(pattern, what to write)]}.
PAGE_FORBIDDEN = {
    # these chapters have no RMSNorm: a bare \varepsilon there would be machine epsilon or Adam's
    "softmax_ce": [(r"\\varepsilon(?!_)", "machine epsilon is \\varepsilon_{mach}")],
    "training": [(r"\\varepsilon(?!_)", "AdamW's constant is \\varepsilon_{adam}")],
    # one row of the attention weights is p, not a
    "backward": [(r"(?<![A-Za-z\\])d[as]" + END, "the gradients of the attention output and "
                                                     "scores are dO and dZ")],
    "attention": [(NOT_NAME + r"a_[jk]" + END, "a row of the attention weights is p: p_j"),
                  (NOT_NAME + r"a\s*=\s*\\operatorname\{softmax\}", "p = softmax(z)")],
    # the online softmax: \ell is the loss, L the number of layers (the recomputation and the
    # KV cache use it), a SwiGLU's hidden array, B the batch
    "memory": [(r"\\ell" + END, "the online softmax's running sum is \\Sigma; \\ell is the loss"),
               (NOT_NAME + r"L(?:_|\s*=)|-\s*L" + END, "the log-sum-exp is \\mathrm{lse}_i; L is "
                                                     "the number of layers"),
               (NOT_NAME + r"a(?:_I|')?" + END, "the unnormalised output is \\tilde o "
                                               "(\\tilde O_I); a is SwiGLU's hidden array"),
               (NOT_NAME + r"z_B" + END, "a block of keys is J; B is the batch")],
}
# Code names in prose that the book replaced (checked on the whole text of markdown).
FORBIDDEN_TEXT = [
    (r"\bdg_final\b|\bg_final\b", "the final gain is w_final (`rms_final`), its gradient "
                                  "`drms_final`"),
    (r"[Jj]acobian-vector product", "the backward pass is a vector-Jacobian product"),
]


def pages() -> list[tuple[str, str, str]]:
    """(page stem, where, text) for every markdown cell of every notebook and every book page,
    and the source of every notebook code cell and figure script (for the figure labels)."""
    out = []
    for nb_path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        nb = json.loads(nb_path.read_text(encoding="utf-8"))
        for i, cell in enumerate(nb["cells"]):
            kind = "markdown" if cell["cell_type"] == "markdown" else "code"
            out.append((nb_path.stem, f"{nb_path.name} cell {i} ({kind})",
                        "".join(cell["source"])))
    for md in sorted((ROOT / "book").glob("*.md")):
        text = md.read_text(encoding="utf-8")
        if md.stem == "notation":  # its table's last column names the spellings it replaced
            text = "\n".join(line.rsplit("|", 2)[0] if line.startswith("| $") else line
                             for line in text.splitlines())
        out.append((md.stem, md.name, CODE_FENCE.sub("", text)))
    for script in [ROOT / "book" / "figures" / "make_model_figure.py",
                   ROOT / "xenith_edu" / "tools" / "plots.py"]:
        out.append((script.stem, script.name, script.read_text(encoding="utf-8")))
    return out


def math_spans(text: str) -> list[str]:
    return [m.group(1) or m.group(2) for m in MATH.finditer(text)]


def violations(stem: str, where: str, text: str) -> list[str]:
    found = []
    rules = FORBIDDEN + PAGE_FORBIDDEN.get(stem, [])
    for span in math_spans(text):
        for pattern, advice in rules:
            if re.search(pattern, span):
                found.append(f"{where}: ${span.strip()[:60]}$: {advice}")
    if not where.endswith("(code)"):
        for pattern, advice in FORBIDDEN_TEXT:
            if re.search(pattern, text):
                found.append(f"{where}: {re.search(pattern, text).group(0)!r}: {advice}")
    return found


def table_rows(text: str, heading: str) -> list[list[str]]:
    """The cells of the first Markdown table after `heading` (a line starting with '#')."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("#") and heading in line)
    rows, seen = [], False
    for line in lines[start + 1:]:
        if line.startswith("|"):
            seen = True
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if not set("".join(cells)) <= set("-: "):
                rows.append(cells)
        elif seen:
            break
    return rows[1:]  # without the header


def notation_table() -> dict[str, str]:
    text = (ROOT / "book" / "notation.md").read_text(encoding="utf-8")
    return {row[0]: row[1] for row in table_rows(text, "The symbol table")}


def shape_legend() -> set[str]:
    text = (ROOT / "book" / "notation.md").read_text(encoding="utf-8")
    return {row[0] for row in table_rows(text, "Shape legend")}


def glossary(section: str) -> list[list[str]]:
    return table_rows((ROOT / "book" / "glossary.md").read_text(encoding="utf-8"), section)


OPERATORS = re.compile(r"\\operatorname|\\sigma|\\odot|\^\\top|\\sum|X W")


@pytest.mark.parametrize("section", ["Indices", "Arrays", "Parameters", "Operations"])
def test_glossary_agrees_with_the_symbol_table(section: str) -> None:
    table = notation_table()
    for symbol, code, *_ in glossary(section):
        if section == "Operations" and symbol not in table:
            assert OPERATORS.search(symbol), (
                f"glossary {section}: {symbol} is neither in the notation's symbol table nor "
                "an operation")
            continue
        assert symbol in table, f"glossary {section}: {symbol} is not in notation.md's table"
        assert code == table[symbol], (
            f"glossary {section}: {symbol} is {code} in code, notation.md says {table[symbol]}")


def test_every_symbol_of_the_table_is_in_the_glossary() -> None:
    listed = {row[0] for s in ["Indices", "Arrays", "Parameters", "Operations"]
              for row in glossary(s)}
    generic = {"$X, W, Y$", "$Q, K, V$"}  # explained with the linear layer and attention
    missing = set(notation_table()) - listed - generic
    assert not missing, f"symbols of notation.md missing from the glossary: {sorted(missing)}"


def test_glossary_sizes_are_the_shape_legend() -> None:
    sizes = {row[0] for row in glossary("Sizes")}
    legend = shape_legend() - {"$N = B \\cdot S$", "$hd = d / H$"} | {"$N$", "$hd$"}
    assert sizes == legend


def test_each_symbol_has_one_meaning() -> None:
    table = notation_table()
    assert len(table) == len(table_rows(
        (ROOT / "book" / "notation.md").read_text(encoding="utf-8"), "The symbol table"))


def test_no_page_uses_a_replaced_spelling() -> None:
    found = [v for stem, where, text in pages() for v in violations(stem, where, text)]
    assert not found, "notation drift:\n" + "\n".join(found)


@pytest.mark.parametrize("text,stem", [
    ("$dz = (p - Y)/N$", "softmax_ce"),
    ("the weights $A = \\operatorname{softmax}(Z)$", "attention"),
    ("with $h = 10^{-3}$", "backward"),
    ("the gain $g_{final}$", "model"),
    ("$x_f W_{head}^\\top$", "glossary"),
    ("rounding $\\sim \\varepsilon / \\delta$", "softmax_ce"),
    ("Adam's $\\epsilon$", "training"),
    ("for each pair $(b, h)$", "attention"),
    ("$h \\mathrel{+}= a_m W_o$", "backward"),
    ("$dv = P^\\top da$", "backward"),
    ("the Jacobian-vector product of the softmax", "attention"),
    ("the running sum $\\ell' = \\alpha\\, \\ell + e^{z_j - m'}$", "memory"),
    ("the log-sum-exp $L_i = m + \\log \\Sigma$", "memory"),
    ("$P_{IJ} = e^{\\,Z_{IJ} - L_I}$", "memory"),
    ("the output $a' = \\alpha\\, a + e^{z_j - m'} V_j$", "memory"),
    ("a new block of scores $z_B$", "memory"),
])
def test_the_drift_check_catches(text: str, stem: str) -> None:
    assert violations(stem, "example", text), text


@pytest.mark.parametrize("text,stem", [
    ("$dz = (p - T)/N$", "softmax_ce"),
    ("the weights $P = \\operatorname{softmax}(Z)$", "attention"),
    ("with $\\delta = 10^{-3}$ on $h$", "backward"),
    ("the gain $w_{final}$ and $\\varepsilon$", "rmsnorm"),
    ("rounding $\\sim \\varepsilon_{mach} / \\delta$", "softmax_ce"),
    ("$h_1 = x W_1$ and $a = s \\odot h_3$", "swiglu"),
    ("$\\Sigma' = \\alpha\\, \\Sigma + \\sum_{j \\in J} e^{z_j - m'}$, "
     "$\\tilde o' = \\alpha\\, \\tilde o$", "memory"),
    ("$\\mathrm{lse}_I = m_I + \\log \\Sigma_I$, $P_{IJ} = e^{Z_{IJ} - \\mathrm{lse}_I}$",
     "memory"),
    ("the cache: $2 L H C\\, hd$ numbers, $L \\cdot (N, d)$, $\\alpha_k \\Sigma_k$", "memory"),
])
def test_the_drift_check_accepts(text: str, stem: str) -> None:
    assert not violations(stem, "example", text), violations(stem, "example", text)
