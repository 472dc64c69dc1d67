from n5fs.cli.main import main

raise SystemExit(main())
