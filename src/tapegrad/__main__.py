from tapegrad.cli import main

raise SystemExit(main())
