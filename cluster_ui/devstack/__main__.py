from cluster_ui.devstack.supervisor import main

raise SystemExit(main())
