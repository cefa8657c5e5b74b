"""Command-line interface: argument parsing, progress display, exit codes, ``--json``. No math."""
