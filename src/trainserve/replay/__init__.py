"""`trainserve replay`: a candidate version judged on captured production traffic, without labels.

Module order: config (flags) -> run (read the capture, pin both versions, send each request to both) -> tally
(the counts, mergeable across shards) -> report (JSON, summary, gate) -> html (the page) -> merge (shards) ->
commands (the CLI). A stage: it imports shared code only (trainserve.client, trainserve.traffic), no other stage.
"""
