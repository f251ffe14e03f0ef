"""The changes a mutation tester makes to one node of a function's syntax tree (a sign, a dropped
term, a transpose, an axis, keepdims, a constant, a boundary...), and their names in the words
of the duality table. `mutate.py` applies them to the references.
"""

from __future__ import annotations

import ast
import copy

# Shape legend: none; this module rewrites syntax trees, not arrays.

# The words of the duality table (the rules chapter), one per kind of change.
RULES = {
    "sign": "a sign is flipped (the backward of a - b sends -dout to b; of -a, -dout to a)",
    "term": "a term is missing (an array used twice gets the sum of both gradients; a sum's "
            "backward keeps every term)",
    "factor": "a factor is missing (an elementwise product's backward multiplies dout by the "
              "other factor)",
    "divide": "a multiplication and a division are confused",
    "transpose": "a transpose is missing (the matmul row: dX = dY W^T, dW = X^T dY)",
    "operands": "the two factors of a matmul are swapped (dX = dY W^T, dW = X^T dY)",
    "axis": "a sum or a normalisation runs over the wrong axis (a broadcast along an axis is a "
            "sum along that same axis in the backward)",
    "keepdims": "keepdims=True is missing: the row statistic is broadcast along the wrong axis",
    "everyaxis": "a sum runs over every axis, not along one (broadcast and sum are each "
                 "other's backward, along the same axis)",
    "mean": "a mean and a sum are confused (a mean's backward divides by the count, a sum's "
            "does not)",
    "constant": "a constant is off",
    "boundary": "a boundary is off by one",
    "init": "an array starts from the wrong values (an accumulator starts from zeros)",
    "accumulate": "a gradient is overwritten instead of accumulated (fan-in adds)",
    "scatter": "the scatter does not add (the gather row: np.add.at(dW, i, dY), so a repeated "
               "index gets the sum of its rows)",
    "broadcast": "a broadcast axis is missing ([:, None]: a column is copied along the rows)",
    "swap": "two arrays are swapped",
    "name": "one array is read in place of another",
    "sqrt": "a square root is missing or misplaced",
    "eps": "eps is on the wrong side of the square root",
    "outputs": "two outputs are swapped",
}



# ----------------------------------------------------------------------------------------------
# The changes: each maps an AST node to (kind, its replacement) pairs.


def literal(node: ast.AST) -> object:
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return None


def _call_name(node: ast.Call) -> str:
    f = node.func
    return f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""


def _num(value: float) -> ast.expr:
    return ast.parse(repr(value), mode="eval").body


def _binop(node: ast.BinOp) -> list[tuple[str, ast.AST]]:
    a, b, op = node.left, node.right, node.op
    out: list[tuple[str, ast.AST]] = []
    if isinstance(op, ast.Add):
        out += [("term", a), ("term", b), ("sign", ast.BinOp(a, ast.Sub(), b))]
        if isinstance(a, ast.Call) and _call_name(a) == "sqrt" and a.args:  # sqrt(x) + eps
            inner = ast.BinOp(a.args[0], ast.Add(), b)
            out.append(("eps", ast.Call(a.func, [inner], [])))
    elif isinstance(op, ast.Sub):
        out += [("term", a), ("term", ast.UnaryOp(ast.USub(), b)),
                ("sign", ast.BinOp(a, ast.Add(), b)), ("sign", ast.BinOp(b, ast.Sub(), a))]
    elif isinstance(op, ast.Mult):
        out += [("factor", a), ("factor", b), ("divide", ast.BinOp(a, ast.Div(), b))]
    elif isinstance(op, ast.Div):
        out += [("factor", a), ("divide", ast.BinOp(a, ast.Mult(), b)),
                ("factor", ast.BinOp(ast.BinOp(a, ast.Div(), b), ast.Div(), b))]
    elif isinstance(op, ast.MatMult):
        out += [("operands", ast.BinOp(b, ast.MatMult(), a))]
    elif isinstance(op, ast.Pow) and literal(b) in (2, 0.5, -0.5):
        out += [("sqrt", ast.BinOp(a, ast.Pow(), _num(-literal(b))))]
    return out


def _call(node: ast.Call) -> list[tuple[str, ast.AST]]:
    name, out = _call_name(node), []
    if name == "sqrt" and node.args:
        out.append(("sqrt", node.args[0]))
        x = node.args[0]
        if isinstance(x, ast.BinOp) and isinstance(x.op, ast.Add):  # sqrt(ms + eps)
            out.append(("eps", ast.BinOp(ast.Call(node.func, [x.left], []), ast.Add(), x.right)))
    if name in ("swapaxes", "transpose") and node.args and isinstance(node.func, ast.Attribute):
        target = node.args[0] if name == "swapaxes" and _is_np(node.func) else node.func.value
        out.append(("transpose", target))
    swaps = {"zeros": "ones", "zeros_like": "ones_like", "ones": "zeros", "ones_like": "zeros_like",
             "sum": "mean", "mean": "sum"}
    if name in swaps and isinstance(node.func, ast.Attribute):
        func = ast.Attribute(node.func.value, swaps[name], ast.Load())
        out.append(("init" if "zeros" in name or "ones" in name else "mean",
                    ast.Call(func, node.args, node.keywords)))
    for i, kw in enumerate(node.keywords):
        rest = node.keywords[:i] + node.keywords[i + 1:]
        if kw.arg == "keepdims" and literal(kw.value) is True:
            out.append(("keepdims", ast.Call(node.func, node.args, rest)))
        if kw.arg == "axis":
            out.append(("everyaxis", ast.Call(node.func, node.args, rest)))
            for other in _axes(literal(kw.value)):
                out.append(("axis", ast.Call(node.func, node.args,
                                             rest + [ast.keyword("axis", _num(other))])))
    out += _swapped_call_args(node)
    return out


def _is_np(func: ast.Attribute) -> bool:
    return isinstance(func.value, ast.Name) and func.value.id in ("np", "numpy")


def _axes(axis: object) -> list[int]:
    if not isinstance(axis, int) or isinstance(axis, bool):
        return []
    return [a for a in (-1, -2, 0, 1) if a != axis][:2]


def _swapped_call_args(node: ast.Call) -> list[tuple[str, ast.AST]]:
    args = node.args
    if len(args) < 2 or any(isinstance(a, ast.Starred) for a in args):
        return []
    out = []
    for i in range(min(len(args), 4) - 1):
        if literal(args[i]) is None and literal(args[i + 1]) is None:
            swapped = args[:i] + [args[i + 1], args[i]] + args[i + 2:]
            out.append(("swap", ast.Call(node.func, swapped, node.keywords)))
    return out


def node_changes(node: ast.AST, parent: ast.AST | None) -> list[tuple[str, ast.AST]]:
    """The changes of one node: (kind, the node that replaces it)."""
    if isinstance(node, ast.BinOp):
        return _binop(node)
    if isinstance(node, ast.Call):
        return _call(node)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub) and literal(node) is None:
        return [("sign", node.operand)]
    if isinstance(node, ast.Attribute) and node.attr == "T":
        return [("transpose", node.value)]
    if isinstance(node, ast.Compare) and len(node.ops) == 1:
        flip = {ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt}
        op = flip.get(type(node.ops[0]))
        return [("boundary", ast.Compare(node.left, [op()], node.comparators))] if op else []
    if isinstance(node, ast.Constant) and type(node.value) in (int, float) \
            and not isinstance(parent, ast.keyword):
        return _constant(node, parent)
    if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Tuple) and any(
            isinstance(e, ast.Constant) and e.value is None for e in node.slice.elts):
        return [("broadcast", node.value)]
    if isinstance(node, ast.AugAssign) and isinstance(node.op, ast.Add):
        return [("accumulate", ast.Assign([node.target], node.value))]
    if isinstance(node, ast.Tuple) and isinstance(parent, ast.Return) and len(node.elts) > 1:
        e = node.elts
        return [("outputs", ast.Tuple(e[:i] + [e[i + 1], e[i]] + e[i + 2:], ast.Load()))
                for i in range(len(e) - 1)]
    return _scatter(node)


def _constant(node: ast.Constant, parent: ast.AST | None) -> list[tuple[str, ast.AST]]:
    c = node.value
    kind = "boundary" if isinstance(parent, ast.Slice | ast.Subscript) else "constant"
    if isinstance(c, int):
        return [(kind, _num(c + 1)), (kind, _num(c - 1))] + (
            [("constant", _num(2 * c))] if kind == "constant" and c not in (0, 1) else [])
    return [("constant", _num(2 * c)), ("constant", _num(c / 2))] if c not in (0.0,) else []


def _scatter(node: ast.AST) -> list[tuple[str, ast.AST]]:
    """np.add.at(a, i, b) -> a[i] += b: a repeated index then keeps only one of its rows."""
    if (isinstance(node, ast.Expr) and isinstance(node.value, ast.Call)
            and _call_name(node.value) == "at" and len(node.value.args) == 3):
        a, i, b = node.value.args
        target = ast.Subscript(copy.deepcopy(a), i, ast.Store())
        return [("scatter", ast.AugAssign(target, ast.Add(), b))]
    return []
