"""``colony``: the command line for researchers, over the REST API (Slurm's sbatch/squeue/scancel
for Colony). The standard library plus ``pathspec`` (for .gitignore rules), and never Django, so
it runs anywhere Python does; ``cluster_ui.cli.main`` has the commands, ``submit`` the submit
flags and code upload, ``script`` batch scripts and their ``#COLONY`` lines, ``cancel`` and
``history`` those commands, ``pack`` the code archive, ``client`` the HTTP and configuration.
Sizes and durations are read and worded by :mod:`agents.units`, as the dashboard and the agent do."""

from cluster_ui.cli.main import main

__all__ = ["main"]
