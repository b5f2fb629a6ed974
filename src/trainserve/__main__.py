from trainserve.cli import console

raise SystemExit(console())
