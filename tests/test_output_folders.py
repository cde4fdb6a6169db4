"""Output folders under attack: a link or a hard link planted in `--render-dir` or `export -o` never redirects a
write. Found so: export and --render-dir wrote through a symlink planted in the folder, overwrote the victim file and
made it 0600. Each test plants the link as another user of the folder would and checks the victim, byte for byte
and mode, after the real CLI ran."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpu_bootstrap.cli.commands import app
from gpu_bootstrap.security import outdir
from tests.nodes.reports import write_report

pytestmark = pytest.mark.unit
ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
runner = CliRunner()
VICTIM_TEXT = "the victim's own file\n"


@pytest.fixture
def victim(tmp_path) -> Path:
    path = tmp_path / "victim" / "bashrc"
    path.parent.mkdir()
    path.write_text(VICTIM_TEXT)
    path.chmod(0o644)
    return path


def untouched(victim: Path) -> bool:
    return victim.read_text() == VICTIM_TEXT and victim.stat().st_mode & 0o777 == 0o644


def plan(tmp_path: Path, render: Path):
    return runner.invoke(app, ["up", "--dry-run", "--offline", "--allow-incomplete", "--kube-version", "1.31", "-c",
                               str(EXAMPLES / "minimal.yaml"), "--render-dir", str(render), "--log-file",
                               str(tmp_path / "log")])


@pytest.mark.parametrize("planted", ["node-prep/plan.txt", "node-prep", "notes-link"])
def test_a_render_dir_holding_a_planted_link_is_refused_and_the_victim_is_untouched(tmp_path, victim, planted):
    render = tmp_path / "render"
    (render / "node-prep").mkdir(parents=True)
    link = render / planted
    if link.is_dir():
        link.rmdir()
    link.symlink_to(victim if planted != "node-prep" else victim.parent)
    result = plan(tmp_path, render)
    assert result.exit_code == 2, result.output
    assert "symbolic link" in result.output and "--render-dir" in result.output, result.output
    assert untouched(victim) and sorted(p.name for p in victim.parent.iterdir()) == ["bashrc"]


def test_a_render_dir_holding_a_hard_link_is_refused(tmp_path, victim):
    render = tmp_path / "render"
    (render / "node-prep").mkdir(parents=True)
    os.link(victim, render / "node-prep" / "plan.txt")
    result = plan(tmp_path, render)
    assert result.exit_code == 2 and "hard link" in result.output, result.output
    assert untouched(victim)


def test_a_render_dir_that_is_itself_a_link_is_refused(tmp_path, victim):
    render = tmp_path / "render"
    render.symlink_to(victim.parent)
    result = plan(tmp_path, render)
    assert result.exit_code == 2 and "is a symbolic link" in result.output, result.output
    assert untouched(victim) and sorted(p.name for p in victim.parent.iterdir()) == ["bashrc"]


def test_links_elsewhere_in_a_render_dir_do_not_matter_and_a_clean_one_is_written(tmp_path, victim):
    """`--render-dir .` in a work tree: links inside folders we never write into are left alone."""
    render = tmp_path / "render"
    (render / "node_modules" / ".bin").mkdir(parents=True)
    (render / "node_modules" / ".bin" / "tool").symlink_to(victim)
    result = plan(tmp_path, render)
    assert result.exit_code == 0, result.output
    assert (render / "node-prep" / "plan.txt").stat().st_mode & 0o777 == 0o600
    assert untouched(victim)


def export(tmp_path: Path, out: Path):
    report = write_report(tmp_path / "report.json", ["gpu-a1", "gpu-a2"])
    return runner.invoke(app, ["export", "--format", "flux", "-o", str(out), "-c", str(EXAMPLES / "fleet-gitops.yaml"),
                               "--offline", "--kube-version", "1.33", "--preflight-report", str(report),
                               "--log-file", str(tmp_path / "log")])


@pytest.mark.parametrize("planted", ["README.md", "flux/kustomizations.yaml", ".gpu-bootstrap-export.json"])
def test_an_earlier_export_with_a_planted_link_is_refused_and_the_victim_is_untouched(tmp_path, victim, planted):
    out = tmp_path / "gpu"
    first = export(tmp_path, out)
    assert first.exit_code == 0, first.output
    (out / planted).unlink()
    (out / planted).symlink_to(victim)
    result = export(tmp_path, out)
    assert result.exit_code == 2, result.output
    assert "symbolic link" in result.output and planted in result.output, result.output
    assert untouched(victim)


def test_a_link_planted_after_the_check_is_not_followed(tmp_path, victim):
    """Between the folder check and the write (a race): the write goes through O_NOFOLLOW descriptors, folder by
    folder, into a new file, so neither a linked file nor a linked folder on the way is followed."""
    root = tmp_path / "out"
    root.mkdir()
    (root / "values.yaml").symlink_to(victim)
    outdir.write(root, "values.yaml", "ours\n")  # the link is replaced by a new file of ours
    assert untouched(victim) and not (root / "values.yaml").is_symlink()
    assert (root / "values.yaml").stat().st_mode & 0o777 == 0o600
    (root / "step").symlink_to(victim.parent, target_is_directory=True)
    with pytest.raises(OSError):
        outdir.write(root, "step/plan.txt", "ours\n")
    (root / "values.yaml").unlink()
    (root / "values.yaml").symlink_to(victim)
    with pytest.raises(OSError):
        outdir.write(root, "values.yaml", "more\n", append=True)
    assert untouched(victim) and sorted(p.name for p in victim.parent.iterdir()) == ["bashrc"]
