from mmlens.cli.main import main

raise SystemExit(main())
