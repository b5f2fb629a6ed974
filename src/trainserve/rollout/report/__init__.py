"""The decision report of a rollout: one self-contained HTML page that says why it ended as it did, written
beside the history when a rollout is promoted, rolled back or paused, and rendered again from the history by
`trainserve rollout report HISTORY`.

    read    the history's records of one rollout as a typed account (its stints, looks, holds, moves)
    words   the verdict in one sentence, and each check's numbers in words
    plots   each check's bounds against its budget at every look, as a PNG
    page    the HTML page
    write   the page written beside the history (and where), never raising for a rollout that just ended
    command `trainserve rollout report`

The page is `<history file name without .jsonl>-<model>-v<candidate>.html`, beside the history: for
models.config, models.config.history-MODEL-vN.html.
"""
