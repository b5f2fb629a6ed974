"""`trainserve drift`: is production still what training saw? Captured inputs against the training profile of
the version that answered them, per feature as effect sizes (PSI, Jensen-Shannon distance, unseen categories),
each beside what sampling noise alone reaches at that many values.

Module order: config (flags) -> compare (one feature: effect sizes, noise allowance, verdict) -> run (read the
capture, count it into each version's training bins) -> report (JSON, table, gates) -> html -> merge (shards) ->
commands (the CLI). A stage: it imports shared code only (trainserve.data_profile, trainserve.traffic,
trainserve.stats), no other stage.
"""
