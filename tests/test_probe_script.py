"""The probe script's variable parts and its framing: the per-command timeout (and how it follows the SSH session's
timeout), the output cap, what a section's exit status means, and cutting the output into sections."""
from __future__ import annotations

import dataclasses

import pytest

from gpu_bootstrap.probes import script
from gpu_bootstrap.probes.script import Section

pytestmark = pytest.mark.unit

MARK = "@@gpu-bootstrap-0123456789abcdef@@"


def test_each_command_waits_15_seconds_unless_told_and_output_is_capped_at_64_kib():
    default, short = script.build(MARK), script.build(MARK, 7)
    assert "sleep 15 & gb_sleep=$!" in default and "sleep 7 & gb_sleep=$!" in short and "sleep 15" not in short
    assert default.count("head -c 65536") == 3  # gb_tool's output, gb_dump's files and /etc/os-release
    assert "head -c 65537" not in default and "%(limit)s" not in default
    assert default.startswith(f"GB_MARK='{MARK}'\n") and default.endswith("\nexit 0\n")


@pytest.mark.parametrize("session, per_command", [
    (100, 15), (60, 15), (59, 14), (40, 10), (12, 3), (11.9, 2), (8, 2), (4, 2), (0, 2)])
def test_the_command_timeout_is_a_quarter_of_the_session_between_2_and_15_seconds(session, per_command):
    assert script.command_timeout(session) == per_command


@pytest.mark.parametrize("rc, output, missing, timed_out, ok", [
    (0, "", False, False, True),
    (1, "", False, False, False),
    (None, "", False, False, False),
    (127, "command not found: nvidia-smi", True, False, False),
    (127, "sh: 1: exec: weird", False, False, False),
    (126, "command not found: nvidia-smi", False, False, False),
    (128, "command not found: nvidia-smi", False, False, False),
    (124, "", False, True, False), (125, "", False, False, False),
    (137, "", False, True, False), (143, "", False, True, False), (144, "", False, False, False),
])
def test_what_a_sections_exit_status_means(rc, output, missing, timed_out, ok):
    section = Section("s", output, rc)
    assert (section.missing, section.timed_out, section.ok) == (missing, timed_out, ok)


def test_a_section_cannot_be_changed_after_it_is_read():
    with pytest.raises(dataclasses.FrozenInstanceError):
        Section("s", "", 0).rc = 1


@pytest.mark.parametrize("output, sections", [
    ("", {}),
    ("no sections at all\n", {}),
    (f"{MARK} begin id\n0\n{MARK} end id 0\n", {"id": Section("id", "0", 0)}),
    (f"{MARK} begin kernel\n{MARK} end kernel 1\n{MARK} begin id\n", {"kernel": Section("kernel", "", 1),
                                                                     "id": Section("id", "", None)}),
])
def test_the_output_is_cut_at_the_markers_from_the_first_character(output, sections):
    assert script.split(output, MARK) == sections
