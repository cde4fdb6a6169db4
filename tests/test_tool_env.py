"""Every process a test starts that runs gpu-bootstrap, helm, kubectl or Go gets its environment from the one helper,
tests.tools.tool_env, which puts the pinned helm and kubectl and the suite's Go first on PATH whatever the caller's
PATH holds (README's `scripts/test` runs the suite with no tools folder on PATH, as a fresh machine has it).

A static check: it reads the test sources (unit layer: no process is started). A call through `subprocess` (run,
Popen, check_output, check_call, call) or through tests.tools.run whose command may start one of those programs
(`sys.executable`, `tool("helm")`, `tool("kubectl")`, a name or string that says helm, kubectl, gpu-bootstrap or go,
or a command it cannot resolve) must pass an `env` that comes from tool_env: a call of it, `dict(...)` or `{**...}`
over one, a name only ever bound to one, or an object's `.env` (every `.env` the test tree defines is checked to be
one). A call that starts none of them though the check cannot tell says why on its line:
`# tool_env: <reason>` (for example, a run that must find no helm).
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.tools import ROOT

pytestmark = pytest.mark.unit

TESTS = ROOT / "tests"
SUBPROCESS_CALLS = {"run", "Popen", "check_output", "check_call", "call"}
TOOL_WORDS = ("helm", "kubectl", "gpu-bootstrap", "gpu_bootstrap")
OPT_OUT = "# tool_env:"
HELPER = "tool_env"


def sources() -> list[Path]:
    return sorted(p for p in TESTS.rglob("*.py") if p.name != Path(__file__).name)


def _name(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return ""


class Module:
    """One test module's tree, with each node's enclosing functions and every binding of a name."""

    def __init__(self, path: Path, text: str | None = None):
        self.path = path
        self.text = path.read_text() if text is None else text
        self.lines = self.text.splitlines()
        self.tree = ast.parse(self.text)
        self.scopes: dict[ast.AST, dict[str, list[ast.AST]]] = {}  # function (or the module) -> name -> values
        self.scope_of: dict[ast.AST, ast.AST] = {}
        self._bind(self.tree, self.tree)
        self.own_run = any(isinstance(n, ast.FunctionDef) and n.name == "run" for n in self.tree.body)
        self.tools_run = any(isinstance(n, ast.ImportFrom) and n.module == "tests.tools"
                             and any(a.name == "run" for a in n.names) for n in ast.walk(self.tree))

    def _bind(self, node: ast.AST, scope: ast.AST) -> None:
        """Each name's bound values per function, and each node's function, so `env` in one test is not taken
        for another test's `env`."""
        names = self.scopes.setdefault(scope, {})
        for child in ast.iter_child_nodes(node):
            self.scope_of[child] = scope
            if isinstance(child, ast.Assign):
                for target in child.targets:
                    if isinstance(target, ast.Name):
                        names.setdefault(target.id, []).append(child.value)
            elif isinstance(child, (ast.AnnAssign, ast.AugAssign)) and isinstance(child.target, ast.Name) \
                    and child.value is not None:
                names.setdefault(child.target.id, []).append(child.value)
            inner = child if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)) else scope
            self._bind(child, inner)

    def values_of(self, name: ast.Name) -> list[ast.AST]:
        """What `name` may hold where it is used: its bindings in the enclosing functions, innermost first, else in
        the module; none for a parameter or an import."""
        scope = self.scope_of.get(name)
        while scope is not None:
            found = self.scopes.get(scope, {}).get(name.id)
            if found:
                return found
            if isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)) and name.id in \
                    {a.arg for a in scope.args.args + scope.args.kwonlyargs + scope.args.posonlyargs}:
                return []
            scope = self.scope_of.get(scope)
        return []

    def opted_out(self, call: ast.Call) -> bool:
        return any(OPT_OUT in self.lines[line - 1] for line in range(call.lineno, (call.end_lineno or call.lineno) + 1))

    # --- what a command starts ------------------------------------------------------------------------------------
    def starts_a_tool(self, command: ast.AST, depth: int = 0) -> bool:
        if depth > 3:
            return True
        if isinstance(command, (ast.List, ast.Tuple)):
            return any(self._element_is_a_tool(element, depth) for element in command.elts)
        if isinstance(command, ast.Name) and self.values_of(command):
            return any(self.starts_a_tool(value, depth + 1) for value in self.values_of(command))
        if isinstance(command, ast.Subscript):
            return self.starts_a_tool(command.value, depth + 1)
        return True  # cannot tell: the environment must come from the helper

    def _element_is_a_tool(self, element: ast.AST, depth: int) -> bool:
        if isinstance(element, ast.Starred):
            value = element.value
            if isinstance(value, ast.ListComp):
                value = value.generators[0].iter
            if isinstance(value, ast.Call):
                return False  # *map(str, paths): arguments
            return self.starts_a_tool(value, depth + 1)
        if isinstance(element, ast.Attribute) and ast.unparse(element) == "sys.executable":
            return True
        if isinstance(element, ast.Constant) and isinstance(element.value, str):
            return element.value in TOOL_WORDS or element.value == "go"
        if isinstance(element, ast.Call) and _name(element.func) == "tool":
            argument = element.args[0] if element.args else None
            return not (isinstance(argument, ast.Constant) and argument.value not in TOOL_WORDS)
        if isinstance(element, ast.Call):
            return False  # str(path), a builder of arguments
        text = ast.unparse(element).lower()
        if isinstance(element, (ast.Name, ast.Attribute)) and any(word in text for word in ("helm", "kubectl")):
            return True
        if isinstance(element, ast.Name) and self.values_of(element):
            return any(self._element_is_a_tool(value, depth + 1) for value in self.values_of(element))
        return False

    # --- where an environment comes from --------------------------------------------------------------------------
    def from_helper(self, env: ast.AST | None, depth: int = 0) -> bool:
        if env is None or depth > 4:
            return False
        if isinstance(env, ast.Call):
            if _name(env.func) == HELPER:
                return True
            if _name(env.func) == "dict" and env.args:
                return self.from_helper(env.args[0], depth + 1) and "PATH" not in {k.arg for k in env.keywords}
            return False
        if isinstance(env, ast.Dict):
            spread = [v for k, v in zip(env.keys, env.values) if k is None]
            overridden = {k.value for k in env.keys if isinstance(k, ast.Constant)}
            return any(self.from_helper(v, depth + 1) for v in spread) and "PATH" not in overridden
        if isinstance(env, ast.BoolOp):
            return all(self.from_helper(v, depth + 1) for v in env.values)
        if isinstance(env, ast.Attribute) and env.attr == "env":
            return True  # every `.env` of the test tree is checked by test_every_env_attribute_comes_from_the_helper
        if isinstance(env, ast.Name) and self.values_of(env):
            return all(self.from_helper(value, depth + 1) for value in self.values_of(env))
        return False

    # --- the calls ------------------------------------------------------------------------------------------------
    def process_calls(self):
        """(call, command, env) for every call that starts a process: subprocess's, and tests.tools.run's (its
        environment is its second argument)."""
        for node in ast.walk(self.tree):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            command = node.args[0] if node.args else next((k.value for k in node.keywords if k.arg == "args"), None)
            env = next((k.value for k in node.keywords if k.arg == "env"), None)
            if isinstance(func, ast.Attribute) and _name(func.value) == "subprocess" and func.attr in SUBPROCESS_CALLS:
                yield node, command, env
            elif isinstance(func, ast.Name) and func.id == "run" and self.tools_run and not self.own_run:
                yield node, command, env if env is not None else (node.args[1] if len(node.args) > 1 else None)

    def offences(self) -> list[str]:
        found = []
        for call, command, env in self.process_calls():
            if command is None or not self.starts_a_tool(command) or self.opted_out(call):
                continue
            if not self.from_helper(env):
                where = f"{self.path.relative_to(ROOT)}:{call.lineno}"
                found.append(f"{where}: {ast.unparse(call)[:110]} (env: {ast.unparse(env) if env else 'the caller'}'s)")
        return found


def env_definitions(module: Module):
    """Every `.env` the module defines: `self.env = ...`, an `env` property, a dataclass field `env: ... = ...`."""
    for node in ast.walk(module.tree):
        if isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Attribute) and target.attr == "env":
                    yield node.lineno, node.value
        elif isinstance(node, ast.FunctionDef) and node.name == "env" \
                and any(_name(d) == "property" for d in node.decorator_list):
            for inner in ast.walk(node):
                if isinstance(inner, ast.Return):
                    yield inner.lineno, inner.value


def test_every_process_that_may_run_a_pinned_tool_gets_its_environment_from_the_helper():
    offences = [line for path in sources() for line in Module(path).offences()]
    assert not offences, ("these start gpu-bootstrap, helm, kubectl or Go (or a command the check cannot resolve) "
                          "with an environment that is not tests.tools.tool_env's; use tool_env(...), or say why "
                          f"on the line with '{OPT_OUT} <reason>':\n" + "\n".join(offences))


def test_every_env_attribute_comes_from_the_helper():
    wrong = []
    for path in sources():
        module = Module(path)
        for line, value in env_definitions(module):
            if not module.from_helper(value):
                wrong.append(f"{path.relative_to(ROOT)}:{line}: {ast.unparse(value)[:100]}")
    assert not wrong, "an object's .env that is not tests.tools.tool_env's:\n" + "\n".join(wrong)


# --- the check can fail: each rule against a module written to break it ---------------------------------------------
CASES = {
    "the caller's environment": ("import subprocess, sys\nsubprocess.run([sys.executable, '-m', 'gpu_bootstrap'])\n",
                                 1),
    "os.environ copied": ("import os, subprocess\nfrom tests.tools import tool\n"
                          "subprocess.run([tool('helm'), 'version'], env=dict(os.environ))\n", 1),
    "the helper, PATH overridden": ("import subprocess, sys\nfrom tests.tools import tool_env\n"
                                    "subprocess.run([sys.executable], env={**tool_env(), 'PATH': '/bin'})\n", 1),
    "a name bound once to the helper and once not": (
        "import os, subprocess\nfrom tests.tools import tool_env\nenv = tool_env()\nenv = dict(os.environ)\n"
        "subprocess.Popen(['kubectl', 'get', 'nodes'], env=env)\n", 1),
    "an unresolvable command": ("import subprocess\ndef f(args):\n    subprocess.run(args)\n", 1),
    "tests.tools.run with another environment": (
        "import os\nfrom tests.tools import run, tool\nrun([tool('kubectl'), 'get'], dict(os.environ))\n", 1),
    "the helper": ("import subprocess, sys\nfrom tests.tools import tool_env\n"
                   "subprocess.run([sys.executable, '-m', 'gpu_bootstrap'], env=tool_env(NO_COLOR='1'))\n", 0),
    "the helper through a name and dict()": (
        "import subprocess\nfrom tests.tools import tool, tool_env\nenv = dict(tool_env(), X='1')\n"
        "subprocess.run([tool('helm'), 'version'], env=env)\n", 0),
    "another program": ("import subprocess\nsubprocess.run(['openssl', 'version'])\n", 0),
    "said why": ("import subprocess\ndef f(args):\n    subprocess.run(args)  # tool_env: etcd, not a pinned tool\n", 0),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_check_finds_what_it_should(case):
    source, expected = CASES[case]
    found = Module(TESTS / "example.py", source).offences()  # parsed from memory; nothing is written
    assert len(found) == expected, found


def test_ci_runs_readmes_test_command_with_the_path_of_a_fresh_machine():
    """.ci/run runs README's test line as README gives it (extra pytest flags aside), and changes no PATH before it:
    CI runs what a user runs."""
    readme = (ROOT / "README.md").read_text().splitlines()
    command = readme[readme.index("```bash") + 2].strip()
    lines = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    runs = [i for i, line in enumerate(lines) if line.split(" ")[0] == command.split(" ")[0]]
    assert runs, f".ci/run does not run README's test command {command!r}"
    before = [line for line in lines[:runs[0] + 1] if not line.startswith("#")]
    assert not [line for line in before if "PATH=" in line or "PATH " in line], before
