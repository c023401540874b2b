#!/usr/bin/env python
"""Django's command-line utility for Colony."""
import os
import sys


def main():
    from agents.hardening import make_non_dumpable

    # Every command (runserver, ingest...) may hold the secrets settings read: no ptrace, no core
    # dump, /proc/<pid>/environ and mem owned by root.
    make_non_dumpable()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "cluster_ui.settings")
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)


if __name__ == "__main__":
    main()
