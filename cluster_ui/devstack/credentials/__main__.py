from cluster_ui.devstack.credentials import main

raise SystemExit(main())
