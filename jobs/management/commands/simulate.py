"""``manage.py simulate``: the trace replay (``python -m jobs.scheduling.simulate``) from manage.py.

Everything after the command goes to the replay's own options, e.g.
``manage.py simulate --trace var/last-week.json --quota-file proposed.json``.
"""

from django.core.management.base import BaseCommand, CommandError

from jobs.scheduling.simulate.__main__ import main


class Command(BaseCommand):
    help = "Replay a trace under several scheduling policies (see python -m jobs.scheduling.simulate --help)."

    def run_from_argv(self, argv):
        # argv: [manage.py, simulate, ...]; the replay parses its own options (and --help).
        status = main(argv[2:])
        if status:
            raise SystemExit(status)

    def handle(self, *args, **options):
        raise CommandError("run it from the command line: manage.py simulate --help")
