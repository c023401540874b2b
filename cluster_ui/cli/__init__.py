"""``colony``: the command line for researchers, over the REST API (Slurm's sbatch/squeue/scancel
for Colony). Standard library only and never imports Django, so it runs anywhere Python does;
``cluster_ui.cli.main`` has the commands, ``client`` the HTTP and configuration, ``units`` the
parsing of sizes and durations."""

from cluster_ui.cli.main import main

__all__ = ["main"]
