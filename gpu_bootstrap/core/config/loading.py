"""Loading gpu-bootstrap.yaml: YAML with the line of every key, environment overrides, and validation errors that
name the field and the file line."""
from __future__ import annotations

import difflib
import os
import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gpu_bootstrap.core.config.fields import DEFAULT_CONFIG, ENV_OVERRIDES
from gpu_bootstrap.core.config.model import Config
from gpu_bootstrap.core.config.monitoring import MonitoringConfig
from gpu_bootstrap.core.config.pools import PoolConfig
from gpu_bootstrap.core.config.scheduling import SchedulerConfig
from gpu_bootstrap.core.config.sections import ClusterConfig, NodePrepConfig
from gpu_bootstrap.core.errors import ConfigError

__all__ = [
    "Source", "apply_env", "describe_loc", "load", "load_node_free_sections", "load_sections", "parse_yaml",
    "validate"]


# --- loading --------------------------------------------------------------------------------------------------------
class Source:
    """Where a config came from, and the line of every key in it (for error messages)."""

    def __init__(self, path: Path | None, lines: dict[tuple, int | str]):
        self.path = path
        self.lines = lines

    def locate(self, loc: tuple) -> str:
        loc = tuple(loc)
        while loc and loc not in self.lines:
            loc = loc[:-1]
        line = self.lines.get(loc)
        if isinstance(line, str):
            return f"flag {line}" if line.startswith("--") else f"environment variable {line}"
        name = str(self.path) if self.path else "<config>"
        return f"{name}:{line}" if line else name


def _line_map(node, path: tuple = (), out: dict | None = None, seen: set | None = None) -> dict[tuple, int]:
    out = {} if out is None else out
    seen = set() if seen is None else seen
    out.setdefault(path, node.start_mark.line + 1)
    if id(node) in seen:  # an alias: walked once already (an alias to a node containing it: see _cycle)
        return out
    seen.add(id(node))
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            child = path + (key.value,)
            out[child] = key.start_mark.line + 1
            _line_map(value, child, out, seen)
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            out[path + (index,)] = item.start_mark.line + 1
            _line_map(item, path + (index,), out, seen)
    return out


def _cycle(node, path: tuple = (), ancestors: tuple = (), done: set | None = None) -> tuple | None:
    """The path of the first alias that refers to a node containing it (recursive data), if any."""
    done = set() if done is None else done
    if id(node) in ancestors:
        return path
    if id(node) in done:
        return None
    if isinstance(node, (yaml.MappingNode, yaml.SequenceNode)):
        children = ([(path + (key.value,), value) for key, value in node.value] if isinstance(node, yaml.MappingNode)
                    else [(path + (index,), item) for index, item in enumerate(node.value)])
        for child_path, child in children:
            found = _cycle(child, child_path, ancestors + (id(node),), done)
            if found is not None:
                return found
    done.add(id(node))
    return None


def parse_yaml(text: str, path: Path | None) -> tuple[Any, Source]:
    name = str(path) if path else "<config>"
    loader = None
    try:  # what yaml.compose and yaml.safe_load do, with one parse for both the nodes (lines) and the data
        loader = yaml.SafeLoader(text)  # its reader already refuses control characters
        node = loader.get_single_node()
        data = loader.construct_document(node) if node is not None else None
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f"{name}:{mark.line + 1}" if mark else name
        problem = getattr(error, "problem", None) or str(error)
        raise ConfigError(f"{where}: YAML syntax error: {problem}", "fix the YAML syntax at that line")
    except RecursionError:
        raise ConfigError(f"{name}: the YAML is nested too deeply", "a config needs a few levels, not hundreds") \
            from None
    finally:
        if loader is not None:
            loader.dispose()
    lines = _line_map(node) if node is not None else {}
    loop = _cycle(node) if node is not None else None
    if loop is not None:
        source = Source(path, lines)
        raise ConfigError(f"{source.locate(loop)}: {describe_loc(loop)}: a YAML alias refers to a node that "
                          f"contains it (recursive data)", "replace the alias (*name) with the value itself")
    return data, Source(path, lines)


def describe_loc(loc: tuple) -> str:
    text = ""
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


def _friendly(error: dict) -> str:
    kind, message = error["type"], error["msg"]
    if kind == "extra_forbidden":
        return "unknown key"
    if kind == "missing":
        return "required key is missing"
    if kind == "literal_error":
        return message.replace("Input should be", "must be")
    if kind.startswith(("int_", "float_", "bool_", "string_", "dict_", "list_", "model_")):
        got = type(error.get("input")).__name__
        return f"{message.replace('Input should be', 'must be')} (got {got})"
    if kind == "value_error":
        return message.removeprefix("Value error, ")
    return message.replace("Input should be", "must be")


def _allowed_keys(model: type[BaseModel], loc: tuple) -> list[str]:
    current: Any = model
    for part in loc[:-1]:
        if isinstance(part, int):
            continue
        field = getattr(current, "model_fields", {}).get(part)
        if field is None:
            return []
        annotation = field.annotation
        args = getattr(annotation, "__args__", ()) or (annotation,)
        current = next((a for a in args if isinstance(a, type) and issubclass(a, BaseModel)), None)
        if current is None:
            return []
    return sorted(field.alias or name for name, field in getattr(current, "model_fields", {}).items())


def validate(data: Any, source: Source, model: type[BaseModel] = None) -> Config:
    model = model or Config
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{source.locate(())}: the config must be a mapping of sections (cluster, ssh, nodes, ...)")
    data = {key: value for key, value in data.items() if value is not None}  # `cluster:` alone means defaults
    try:
        config = model.model_validate(data)
    except ValidationError as error:
        problems = []
        for item in error.errors():
            loc = tuple(item["loc"])
            message = _friendly(item)
            if message.startswith(("nodes[", "nodes:", "pools[", "node_prep.")) and ":" in message:  # model-level errors carry their own path
                field, message = message.split(": ", 1)
                loc = _parse_path(field)
            if item["type"] == "extra_forbidden":
                allowed = _allowed_keys(model, loc)
                likely = difflib.get_close_matches(str(loc[-1]), allowed, n=1, cutoff=0.75) if loc else []
                if likely:
                    message += f": did you mean {likely[0]}?"
                if allowed:
                    message += f" (allowed here: {', '.join(allowed)})"
            problems.append(f"{source.locate(loc)}: {describe_loc(loc) or '<top>'}: {message}")
        # from None: the ValidationError (chained, it would print with the traceback in the log) quotes the input
        # values, secrets among them (monitoring.values given as a string, a misspelled values block)
        raise ConfigError("\n".join(problems), "fix the config file and run again (nothing was changed)") from None
    cluster = getattr(config, "cluster", None)
    if cluster is not None and hasattr(cluster, "_origins"):  # where the cluster's coordinates came from
        cluster._origins = {key: source.locate(("cluster", key)) for key in ("kubeconfig", "context")
                            if ("cluster", key) in source.lines}
    return config


def _parse_path(text: str) -> tuple:
    parts: list = []
    for name, index in re.findall(r"([A-Za-z_]+)|\[(\d+)\]", text):
        parts.append(int(index) if index else name)
    return tuple(parts)


def apply_env(data: dict, environ: dict, source: Source) -> dict:
    for variable, (section, key) in ENV_OVERRIDES.items():
        if variable in environ:
            data.setdefault(section, {})
            if not isinstance(data[section], dict):
                continue
            data[section][key] = environ[variable]
            source.lines[(section, key)] = variable
    return data


def load(path: Path | None, environ: dict | None = None, overrides: dict | None = None,
         model: type[Config] = Config) -> Config:
    """Read, merge environment and flag overrides, validate. Raises ConfigError naming file:line and field.
    `model`: the config's model with the sections steps bring themselves (steps.config_model(); core cannot know
    them)."""
    path = Path(path) if path else Path(DEFAULT_CONFIG)
    if not path.exists():
        raise ConfigError(f"config file {path} not found",
                          "pass -c/--config, or run 'gpu-bootstrap init' to write a commented example")
    data, source = _read(path, environ, overrides)
    return validate(data, source, model)


class _Sections(BaseModel):
    """The sections a command without nodes needs (simulate, status, rbac --for status); the others are not read."""

    model_config = ConfigDict(extra="ignore", frozen=True)
    cluster: ClusterConfig = Field(default_factory=ClusterConfig)
    scheduler: SchedulerConfig = Field(default_factory=SchedulerConfig)
    node_prep: NodePrepConfig = Field(default_factory=NodePrepConfig)
    monitoring: MonitoringConfig = Field(default_factory=MonitoringConfig)  # where status finds Prometheus
    pools: list[PoolConfig] = Field(default_factory=list)  # the size the scheduler's config was chosen for


def load_sections(path: Path | None, environ: dict | None = None,
                  overrides: dict | None = None) -> tuple[SchedulerConfig, ClusterConfig]:
    """The scheduler and cluster sections, with the same precedence as load(); the default file is optional."""
    sections = load_node_free_sections(path, environ, overrides)
    return sections.scheduler, sections.cluster


def load_node_free_sections(path: Path | None, environ: dict | None = None, overrides: dict | None = None):
    """The cluster, scheduler and node_prep sections (no nodes needed), as load() reads them; the default file is
    optional."""
    if path is not None and Path(path) != Path(DEFAULT_CONFIG) and not Path(path).exists():
        raise ConfigError(f"config file {path} not found")
    path = Path(path) if path else Path(DEFAULT_CONFIG)
    data, source = _read(path, environ, overrides) if path.exists() else _read(None, environ, overrides)
    return validate(data, source, _Sections)


def _read(path: Path | None, environ: dict | None, overrides: dict | None) -> tuple[Any, Source]:
    """A config file (or none) with the environment and the flags merged in, and where each key came from."""
    environ = os.environ if environ is None else environ
    if path is None:
        data, source = {}, Source(None, {})
    else:
        if path.is_dir():
            raise ConfigError(f"config path {path} is a directory, not a YAML file")
        try:
            raw = path.read_bytes()
        except OSError as error:
            raise ConfigError(f"cannot read config file {path}: {error}")
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as error:
            line = raw.count(b"\n", 0, error.start) + 1
            raise ConfigError(f"{path}:{line}: the config file is not UTF-8 text (byte 0x{raw[error.start]:02x} at "
                              f"offset {error.start})", "save it as UTF-8") from None
        data, source = parse_yaml(text, path)
    if isinstance(data, dict):
        data = apply_env(data, environ, source)
        for (section, key), value in (overrides or {}).items():
            if value is not None:
                if data.get(section) is None:
                    data[section] = {}  # `cluster:` with nothing under it
                if isinstance(data[section], dict):
                    data[section][key] = value
                    source.lines[(section, key)] = f"--{key}"
    return data, source
