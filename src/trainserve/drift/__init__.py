"""`trainserve drift`: is production still what training saw? Captured inputs against the training profile of
the version that answered them, per feature as effect sizes (PSI, Jensen-Shannon distance, unseen categories).

Module order: config (flags) -> stats (PSI, JS distance, per-feature comparison) -> run (read the capture, count
it into each version's training bins) -> report (JSON, table, gates, HTML) -> commands (the CLI). A stage: it
imports shared code only (trainserve.data_profile, trainserve.traffic), no other stage.
"""
