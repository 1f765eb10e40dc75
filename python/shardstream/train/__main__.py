from shardstream.train.cli import main

raise SystemExit(main())
