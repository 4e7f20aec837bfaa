from mmlens.cli import main

raise SystemExit(main())
