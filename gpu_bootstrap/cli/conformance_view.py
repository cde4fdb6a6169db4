"""What `doctor --conformance` shows: a row per checklist item (its level, status, whether gpu-bootstrap covers it,
the note), the files written, and what the program's validator would refuse; or the same as JSON."""
from __future__ import annotations

from gpu_bootstrap.cli.ui import console, escape, print_json


def show_conformance(report, as_json: bool) -> bool:
    """Print the report; True when no MUST that gpu-bootstrap covers failed."""
    from gpu_bootstrap.render.conformance import fails_the_run
    if as_json:
        print_json({"ok": report.ok, "folder": str(report.folder), "validator_problems": report.problems,
                    "items": [{"id": i.id, "section": i.section, "level": i.level,
                               "status": report.results[i.id].status, "in_scope": report.results[i.id].in_scope,
                               "fails_the_run": fails_the_run(i, report.results[i.id]),
                               "notes": report.results[i.id].notes,
                               "seconds": round(report.results[i.id].seconds, 1)} for i in report.items]})
        return report.ok
    from rich.table import Table
    grid = Table(title="Kubernetes AI Conformance, proved on this cluster", title_justify="left")
    for column in ("item", "level", "status", "covered", "notes"):
        grid.add_column(column)
    for item in report.items:
        result = report.results[item.id]
        status = escape(result.status)
        if fails_the_run(item, result):
            status = f"[red]{status}[/]"
        elif result.status == "Implemented":
            status = f"[green]{status}[/]"
        grid.add_row(item.id, item.level, status, "yes" if result.in_scope else "no", escape(result.notes))
    out = console()
    out.print(grid)
    out.print(escape(f"written: {report.folder}/AIConformance.yaml, junit.xml and a log per item"))
    if report.problems:
        out.print(escape(f"the program's validator (scripts/validate.go) would refuse it for {len(report.problems)} "
                         f"reason(s), besides its online checks (URLs reachable, the vendor a CNCF member):"))
        for problem in report.problems:
            out.print(escape(f"  - {problem}"))
    failed = [i.id for i in report.items if fails_the_run(i, report.results[i.id])]
    out.print(escape(f"failed: {', '.join(failed)}: a MUST that gpu-bootstrap's platform covers is not proved" if failed
                     else "every MUST that gpu-bootstrap's platform covers is proved"))
    return report.ok
