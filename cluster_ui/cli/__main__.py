import sys

from cluster_ui.cli.main import main

sys.exit(main())
