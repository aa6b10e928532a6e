from crawlerd.cli import main

raise SystemExit(main())
