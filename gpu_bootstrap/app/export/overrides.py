"""`export`'s overrides: one config serves `up` and Git. What a run from this machine needs (a chart as a local
archive, a CA generated and kept in a Secret) is not what a GitOps engine can use (it fetches charts from
repositories; a CA cannot be committed), so `export --chart-repository` and `--certificates` change those settings
for the bundle only, and the bundle's README lists each change (`Override.line`).
"""
from __future__ import annotations

import tarfile
from dataclasses import dataclass
from pathlib import Path

from gpu_bootstrap.core.errors import UsageError

# the config sections that name a chart: their key as users write it -> their path in the config model
CHART_SECTIONS = {"gpu_operator": ("gpu_operator",), "gpu_operator.dra_driver": ("gpu_operator", "dra_driver"),
                  "monitoring": ("monitoring",), "queues.kueue": ("queues", "kueue")}
SCHEMES = ("https://", "http://", "oci://")
FLAG = "--chart-repository"


@dataclass(frozen=True)
class Override:
    key: str  # as users write it: gpu_operator.chart
    was: str
    now: str
    flag: str

    def line(self) -> str:
        return f"| `{self.key}` | {self.was} | {self.now} | `{self.flag}` |"


def parse_chart_repositories(given: list[str]) -> dict[str, str]:
    """`default` (every chart given as a local file, from its default repository), `SECTION=default` or
    `SECTION=URL` -> {section: 'default' | URL}. Bad input is exit 2, naming the flag and what it takes."""
    chosen: dict[str, str] = {}
    for item in given:
        section, _, source = item.rpartition("=") if "=" in item else ("", "", item)
        if section and section not in CHART_SECTIONS:
            raise UsageError(f"{FLAG} {item}: {section!r} is not a config section with a chart",
                             f"one of: {', '.join(CHART_SECTIONS)} (or leave SECTION= out for every local chart)")
        if source != "default" and not source.startswith(SCHEMES):
            raise UsageError(f"{FLAG} {item}: {source!r} is neither 'default' nor a repository URL",
                             "give default (the section's own repository) or an https:// or oci:// URL")
        if not section and source != "default":
            raise UsageError(f"{FLAG} {item}: a URL needs the section it is for",
                             f"e.g. {FLAG} monitoring={source}")
        chosen[section or "*"] = source
    return chosen


def apply(config, chart_repositories: dict[str, str], certificates: str | None):
    """(config for the bundle, [Override]): the chart sources and certificate mode the flags ask for."""
    done: list[Override] = []
    for section, path in CHART_SECTIONS.items():
        flag = f"{FLAG} {section}={chart_repositories[section]}" if section in chart_repositories else \
            f"{FLAG} default" if "*" in chart_repositories and _local(_get(config, path)) else None
        if flag is None or not _enabled(config, section):
            continue
        source = chart_repositories.get(section, "default")
        config, override = _from_repository(config, section, path, source, flag)
        done += [override] if override else []
    if certificates is not None and certificates != config.admission.certificates:
        done.append(Override("admission.certificates", config.admission.certificates, certificates,
                             f"--certificates {certificates}"))
        config = config.model_copy(update={"admission": config.admission.model_copy(
            update={"certificates": certificates})})
    return config, done


def _enabled(config, section: str) -> bool:
    if section == "queues.kueue":  # the queues step's own section (absent from a config built without its model)
        return bool(getattr(getattr(config, "queues", None), "teams", None))
    if section == "gpu_operator.dra_driver":
        return config.gpu_operator.enabled and config.gpu_operator.allocation == "dra"
    return getattr(config, section).enabled


def _get(config, path: tuple[str, ...]):
    for name in path:
        config = getattr(config, name)
    return config


def _local(section) -> bool:
    """A chart given as a local .tgz or directory (as `up` takes it from this machine)."""
    chart = section.chart
    return not chart.startswith(SCHEMES) and ("/" in chart or chart.endswith((".tgz", ".tar.gz")))


def _from_repository(config, section: str, path: tuple[str, ...], source: str, flag: str):
    current = _get(config, path)
    defaults = type(current)()
    repository = defaults.repository if source == "default" else source.rstrip("/")
    version = current.version or (_archive_version(Path(current.chart)) if _local(current) else None)
    updated = current.model_copy(update={"chart": defaults.chart, "repository": repository, "version": version})
    if updated == current:
        return config, None
    was = f"{current.chart}{' ' + current.version if current.version else ''}" if _local(current) else \
        f"{current.repository} {current.chart} {current.version or ''}".strip()
    now = f"{repository} {defaults.chart} {version or '(newest validated)'}"
    return _set(config, path, updated), Override(f"{section}.chart", was, now, flag)


def _set(config, path: tuple[str, ...], value):
    if len(path) == 1:
        return config.model_copy(update={path[0]: value})
    parent = getattr(config, path[0])
    return config.model_copy(update={path[0]: parent.model_copy(update={path[1]: value})})


def _archive_version(chart: Path) -> str | None:
    """The version a local chart (a .tgz or a directory) declares in its Chart.yaml: what `up` installed, so the
    bundle pins the same release from the repository. None when it cannot be read (the plan then says which)."""
    import yaml
    try:
        if chart.is_dir():
            text = (chart / "Chart.yaml").read_text()
        else:
            with tarfile.open(chart) as archive:
                member = next(m for m in archive.getmembers() if m.name.count("/") == 1 and
                              m.name.endswith("/Chart.yaml"))
                text = archive.extractfile(member).read().decode()
        version = (yaml.safe_load(text) or {}).get("version")
    except (OSError, StopIteration, tarfile.TarError, AttributeError, UnicodeDecodeError, yaml.YAMLError):
        return None
    return str(version) if version else None
