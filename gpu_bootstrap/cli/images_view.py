"""How `gpu-bootstrap images` shows its list: plain lines people can read and scripts can cut (text), or one JSON
document (json). No colours: the list is often piped into a mirroring script."""
from __future__ import annotations

import json

import typer


def show_images(found, present: dict[str, bool] | None, as_json: bool, allow_incomplete: bool = False) -> bool:
    """Print the list (and the --check answers); False when an image is missing, or the list is incomplete and
    that was not allowed."""
    missing = sorted(ref for ref, there in (present or {}).items() if not there)
    ok = not missing and (allow_incomplete or not found.incomplete)
    if as_json:
        document = found.document()
        if present is not None:
            document["check"] = {"registry": found.mirror, "present": sum(present.values()), "missing": missing}
        document["ok"] = ok
        typer.echo(json.dumps(document, indent=2))
        return ok
    for image in found.sorted():
        mark = "" if present is None else ("present  " if present.get(image.reference) else "MISSING  ")
        typer.echo(f"{mark}{image.reference}")
        if image.source != image.reference:
            typer.echo(f"    copy from: {image.source}")
        typer.echo(f"    pulled by: {'; '.join(sorted(image.pulled_by))}")
        for note in sorted(image.notes):
            typer.echo(f"    note: {note}")
    counts = ", ".join(f"{who} {count}" for who, count in found.per_component().items())
    typer.echo(f"\n{len(found.images)} images ({counts})")
    for note in found.notes:
        typer.echo(f"note: {note}")
    for problem in found.incomplete:
        typer.echo(f"incomplete{' (accepted: --allow-incomplete)' if allow_incomplete else ''}: {problem}", err=True)
    if found.incomplete and not allow_incomplete:
        typer.echo("error: the image list is incomplete — pass --allow-incomplete to accept a partial list", err=True)
    if present is not None:
        if missing:
            typer.echo(f"{len(missing)} of {len(present)} images missing from {found.mirror}:", err=True)
            for ref in missing:
                typer.echo(f"  {ref}", err=True)
        else:
            typer.echo(f"all {len(present)} images are in {found.mirror}")
    return ok
