"""The command line: the Typer app (commands.py: every command, option and its help; status.py: `status`'s), what
the commands share (common.py: options, error handling, exit codes), and the rich presentation (ui.py,
status_view.py, images_view.py).
Thin: each command parses, calls the application layer (app/) and shows what it returns.

May import: everything in gpu_bootstrap.
"""
