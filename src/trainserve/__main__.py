from trainserve.cli import main

raise SystemExit(main())
