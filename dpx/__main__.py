from dpx.cli import main

raise SystemExit(main())
