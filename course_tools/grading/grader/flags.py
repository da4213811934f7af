"""Code in a submission that a person should read before trusting its grade.

**Grader side**: runs in the grader's own process, never beside student code.

:func:`flags` reads (never runs) the student's code: the answer cells, and every code cell whose
source is not that of a cell of the released notebook. It reports, one short line each, what can
reach the grader's machinery from inside the kernel: IPython's hooks (``get_ipython``, input and
AST transformers, event callbacks, custom exception handlers), the interpreter's (trace and audit
hooks, frames, closures, code objects, ``gc``, ``ctypes``, ``inspect``, threads and signals),
changes to the libraries the tests call (``F.softmax = ...``, ``setattr(torch, ...)``, ``del
math.pi``, through any alias the notebook imports). Whether an answer calls course_lib's
reference for its own exercise is decided by what runs, not what is written: the graded run
observes the reference by identity (:mod:`course_tools.grading.sandboxed.guard`).
No verdict depends on any of this (verdicts are judged outside
the sandbox from data, :mod:`course_tools.grading.grader.verdicts`, whose graded runs also report what
their answers ran); the flags are for a person to read, not a penalty.

    >>> flags(nb)  # doctest: +SKIP
    ['ex_causal_mask: imports ctypes (ctypes)', 'cell 7: uses get_ipython']
"""

from __future__ import annotations

import ast
import re

from course_tools import notebook

MODULES = {"gc": "gc", "ctypes": "ctypes", "threading": "threads",
           "_thread": "threads", "signal": "signal handlers"}
ATTRIBUTES = {  # attribute or name -> what it is for
    "_getframe": "frames", "f_back": "frames", "f_globals": "frames", "f_locals": "frames",
    "f_code": "frames", "tb_frame": "frames", "gi_frame": "frames", "cr_frame": "frames",
    "__closure__": "closures", "__code__": "code objects", "__globals__": "function globals",
    "__defaults__": "function defaults", "__kwdefaults__": "function defaults",
    "__builtins__": "the builtins", "addaudithook": "an audit hook", "settrace": "a trace function",
    "setprofile": "a profile function", "set_custom_exc": "a custom exception handler",
    "ast_transformers": "AST transformers", "__torch_function__": "__torch_function__",
    "get_ipython": "get_ipython", "__import__": "__import__",
}
# Names the notebooks import the protected libraries as, before any alias the notebook adds.
PROTECTED_ROOTS = ("torch", "numpy", "builtins", "math", "course_lib", "course_tools", "einops")
DEFAULT_ALIASES = {"torch": "torch", "np": "numpy", "numpy": "numpy", "math": "math",
                   "builtins": "builtins", "course_lib": "course_lib", "course_tools": "course_tools"}
NOT_PARSED = "does not parse (not checked)"
MAGIC_CALL = re.compile(r"get_ipython\(\)\.(?=(run_line_magic|run_cell_magic|system|getoutput)\()")


def flags(nb, release_nb=None) -> list[str]:
    """One line per suspicious thing in the student's code of ``nb`` (see the module docstring)."""
    aliases = dict(DEFAULT_ALIASES)
    for cell in nb.cells:  # aliases from every cell: `import torch.nn.functional as F` may be in set-up
        tree = _parse(cell.source) if cell.cell_type == "code" else None
        if tree is not None:
            aliases.update(_aliases(tree))
    released = None if release_nb is None else {c.source for c in release_nb.cells if c.cell_type == "code"}
    out = []
    for index, cell in enumerate(nb.cells):
        meta = notebook.nbgrader_meta(cell)
        is_answer = bool(meta.get("solution"))
        changed = released is not None and cell.source not in released
        if cell.cell_type != "code" or not (is_answer or changed):
            continue
        where = meta.get("grade_id") or f"cell {index}"
        tree = _parse(cell.source)
        found = [NOT_PARSED] if tree is None else _CellScan(aliases).run(tree)
        out += [f"{where}: {what}" for what in dict.fromkeys(found)]
    return out


def _parse(source: str) -> ast.AST | None:
    """The cell's syntax, its IPython magics read as the calls IPython makes of them (a magic is
    no use of ``get_ipython`` by the student)."""
    try:
        python = notebook.python_source(source)
        if python is not source:
            python = MAGIC_CALL.sub("_magic_.", python)
        return ast.parse(python)
    except (SyntaxError, ValueError):
        return None


def _aliases(tree: ast.AST) -> dict[str, str]:
    """Local name -> protected module it stands for: ``import torch.nn.functional as F`` -> F."""
    out = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] in PROTECTED_ROOTS:
                    out[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module.split(".")[0] in PROTECTED_ROOTS:
                for a in node.names:
                    out[a.asname or a.name] = f"{node.module}.{a.name}"
    return out


def _root(node: ast.AST) -> str | None:
    """The name an attribute chain starts from: ``torch.nn.functional.softmax`` -> ``torch``,
    ``vars(F)['softmax']`` -> ``F``."""
    while isinstance(node, (ast.Attribute, ast.Subscript, ast.Call)):
        if isinstance(node, ast.Call):
            wraps = isinstance(node.func, ast.Name) and node.func.id in ("vars", "getattr") and node.args
            node = node.args[0] if wraps else node.func
        else:
            node = node.value
    return node.id if isinstance(node, ast.Name) else None


def _dotted(node: ast.AST) -> str:
    return ast.unparse(node) if len(ast.unparse(node)) <= 60 else ast.unparse(node)[:57] + "..."


class _CellScan(ast.NodeVisitor):
    """The flags of one parsed cell."""

    def __init__(self, aliases: dict[str, str]):
        self.aliases, self.found = aliases, []

    def run(self, tree: ast.AST) -> list[str]:
        self.visit(tree)
        return self.found

    def _module_of(self, node: ast.AST) -> str | None:
        root = _root(node)
        return self.aliases.get(root) if root else None

    def visit_Import(self, node: ast.Import) -> None:
        for a in node.names:
            self._imported(a.name)
        self.generic_visit(node)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        self._imported(node.module or "")
        for a in node.names:
            if a.name in ATTRIBUTES:
                self.found.append(f"uses {ATTRIBUTES[a.name]}")
        self.generic_visit(node)

    def _imported(self, module: str) -> None:
        what = MODULES.get(module.split(".")[0])
        if what:
            self.found.append(f"imports {module} ({what})")

    def visit_Name(self, node: ast.Name) -> None:
        if node.id in ATTRIBUTES:
            self.found.append(f"uses {ATTRIBUTES[node.id]}")

    def visit_Attribute(self, node: ast.Attribute) -> None:
        if node.attr in ATTRIBUTES:
            self.found.append(f"uses {ATTRIBUTES[node.attr]}")
        elif node.attr.startswith("input_transformer"):
            self.found.append("uses input transformers")
        elif node.attr == "register" and isinstance(node.value, (ast.Attribute, ast.Name)) and (
                getattr(node.value, "attr", None) == "events" or getattr(node.value, "id", None) == "events"):
            self.found.append("registers an IPython event callback")
        self.generic_visit(node)

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        if node.name in ATTRIBUTES:
            self.found.append(f"defines {node.name}")
        self.generic_visit(node)

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Constant(self, node: ast.Constant) -> None:
        if node.value == "__torch_function__":
            self.found.append("names __torch_function__ in a string")

    def _changes(self, targets: list[ast.AST], verb: str) -> None:
        for target in targets:
            for t in (target.elts if isinstance(target, (ast.Tuple, ast.List)) else [target]):
                if isinstance(t, (ast.Attribute, ast.Subscript)) and self._module_of(t):
                    self.found.append(f"{verb} {_dotted(t)} (library code)")

    def visit_Assign(self, node: ast.Assign) -> None:
        self._changes(node.targets, "assigns")
        self.generic_visit(node)

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        self._changes([node.target], "assigns")
        self.generic_visit(node)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        if node.value is not None:
            self._changes([node.target], "assigns")
        self.generic_visit(node)

    def visit_Delete(self, node: ast.Delete) -> None:
        self._changes(node.targets, "deletes")
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        name = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", None)
        if name in ("setattr", "delattr") and node.args and self._module_of(node.args[0]):
            self.found.append(f"{name} on {_dotted(node.args[0])} (library code)")
        if name in ("__import__", "import_module") and node.args and isinstance(node.args[0], ast.Constant):
            self._imported(str(node.args[0].value))
        self.generic_visit(node)
