"""Charts pulled from a repository are checked against the sha256 in the supply-chain catalogue (core/data/images.yaml),
with the real helm pulling from a real HTTP chart repository on 127.0.0.1 (`helm repo index` over the real chart
archives from ../shared/charts)."""
from __future__ import annotations

import functools
import http.server
import io
import logging
import shutil
import tarfile
import threading
from pathlib import Path

import pytest

from gpu_bootstrap.adapters.helm import ChartDigestMismatch, Helm
from gpu_bootstrap.core.refs import Chart
from tests.conftest import chart
from tests.tools import tool_env, run, tool


@pytest.fixture
def chart_repository(tmp_path):
    """serve(folder) -> the URL of an HTTP chart repository holding the .tgz files in folder (indexed by helm)."""
    servers = []

    def serve(folder: Path) -> str:
        handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(folder))
        handler.log_message = lambda *args: None
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        url = f"http://127.0.0.1:{server.server_address[1]}/"
        run([tool("helm"), "repo", "index", str(folder), "--url", url], tool_env(tmp_path))
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return url

    yield serve
    for server in servers:
        server.shutdown()
        server.server_close()


def helm(tmp_path) -> Helm:
    return Helm(executable=tool("helm"))


class Records(logging.Handler):
    """The adapter's log records, read from its own logger (the CLI's logging setup, run earlier in the same worker,
    may stop them from reaching pytest's capture)."""

    def __init__(self):
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record):
        self.lines.append(record.getMessage())

    def __enter__(self):
        self.logger = logging.getLogger("gpu_bootstrap.helm")
        self.level = self.logger.level
        self.logger.setLevel(logging.INFO)
        self.logger.addHandler(self)
        return self

    def __exit__(self, *exc):
        self.logger.removeHandler(self)
        self.logger.setLevel(self.level)

    @property
    def text(self) -> str:
        return "\n".join(self.lines)


def tampered(original: Path, target: Path) -> Path:
    """The same chart name and version with one more file: another archive, another sha256."""
    with tarfile.open(original, "r:gz") as source, tarfile.open(target, "w:gz") as out:
        for member in source.getmembers():
            out.addfile(member, source.extractfile(member) if member.isfile() else None)
        extra = b"# planted\n"
        info = tarfile.TarInfo("gpu-operator/templates/NOTES-extra.txt")
        info.size = len(extra)
        out.addfile(info, io.BytesIO(extra))
    return target


def test_the_pinned_archive_is_checked_and_then_used(chart_repository, tmp_path, helm_on_path):
    folder = tmp_path / "repo"
    folder.mkdir()
    shutil.copy(chart("gpu-operator-v26.7.0.tgz"), folder)
    url = chart_repository(folder)
    client = helm(tmp_path)
    with Records() as records:
        meta = client.show_chart(Chart("gpu-operator", url, "v26.7.0"))
        manifests = client.template("gpu-operator", Chart("gpu-operator", url, "v26.7.0"), {}, "gpu-operator", "1.33.0")
    assert meta["name"] == "gpu-operator" and meta["version"] == "v26.7.0"
    assert "kind: ClusterPolicy" in manifests
    assert "matches the catalogue" in records.text
    assert client.attempts == 3  # pull once, then show and template use that archive


def verified_catalogue(monkeypatch):
    """The catalogue as it reads once a chart's sums come from its repository's index (`verified: true`)."""
    import copy
    from gpu_bootstrap.core import catalogue as images
    # A copy: catalogue() is cached, and editing the cached dict in place would leak into every later test.
    loaded = copy.deepcopy(images.catalogue())
    loaded["charts"]["gpu-operator"]["verified"] = True
    monkeypatch.setattr(images, "catalogue", lambda: loaded)


def test_another_archive_under_a_pinned_version_is_used_with_a_warning_while_the_sum_is_ours(
        chart_repository, tmp_path, helm_on_path):
    """The shipped sums come from our own packaging of the release tags (not the repository's index), so the
    repository's own archive may differ: it is used, with both sums named, never silently."""
    folder = tmp_path / "repo"
    folder.mkdir()
    tampered(chart("gpu-operator-v26.7.0.tgz"), folder / "gpu-operator-v26.7.0.tgz")
    url = chart_repository(folder)
    with Records() as records:
        manifests = helm(tmp_path).template("gpu-operator", Chart("gpu-operator", url, "v26.7.0"), {}, "gpu-operator",
                                            "1.33.0")
    assert "kind: ClusterPolicy" in manifests
    assert "eaedb7ef706eb1c3" in records.text and "used unverified" in records.text


def test_another_archive_under_the_pinned_version_is_refused(chart_repository, tmp_path, helm_on_path, monkeypatch):
    verified_catalogue(monkeypatch)
    folder = tmp_path / "repo"
    folder.mkdir()
    tampered(chart("gpu-operator-v26.7.0.tgz"), folder / "gpu-operator-v26.7.0.tgz")
    url = chart_repository(folder)
    with pytest.raises(ChartDigestMismatch) as refused:
        helm(tmp_path).template("gpu-operator", Chart("gpu-operator", url, "v26.7.0"), {}, "gpu-operator", "1.33.0")
    text = refused.value.one_line()
    assert "gpu-operator v26.7.0" in text and "eaedb7ef706eb1c3" in text and "refused" in text
    assert refused.value.exit_code == 1


def test_a_version_the_catalogue_lacks_is_used_with_a_warning(chart_repository, tmp_path, helm_on_path):
    folder = tmp_path / "repo"
    folder.mkdir()
    shutil.copy(chart("gpu-operator-v25.10.1.tgz"), folder)
    (folder / "gpu-operator-v25.10.1.tgz").rename(folder / "renamed.tgz")  # the index names the file, not us
    url = chart_repository(folder)
    with Records() as records:
        meta = helm(tmp_path).show_chart(Chart("gpu-operator", url, "v25.10.1"))
    assert meta["version"] == "v25.10.1"
    assert "unverified" not in records.text and "matches the catalogue" in records.text  # v25.10.1 is catalogued
    with Records() as records:
        meta = helm(tmp_path).show_chart(Chart("kube-prometheus-stack", _serve_made_up_release(chart_repository,
                                                                                              tmp_path), "1.2.3"))
    assert meta["name"] == "kube-prometheus-stack"
    assert "not in gpu-bootstrap's catalogue" in records.text and "unverified" in records.text


def _serve_made_up_release(chart_repository, tmp_path) -> str:
    """A release of kube-prometheus-stack the catalogue has no sha256 for (helm create + helm package)."""
    folder = tmp_path / "made-up"
    folder.mkdir()
    env = tool_env(tmp_path)
    run([tool("helm"), "create", str(tmp_path / "kube-prometheus-stack")], env)
    run([tool("helm"), "package", str(tmp_path / "kube-prometheus-stack"), "--version", "1.2.3", "--destination",
         str(folder)], env)
    return chart_repository(folder)
