from attnkit.cli.main import main

raise SystemExit(main())
