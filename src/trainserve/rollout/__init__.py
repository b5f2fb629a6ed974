"""Gated rollout with TF Serving's version labels: a published version is served as the `candidate`,
evaluated on the real server, and only then labelled `stable`; `rollback` moves `stable` back.

The state is the serving config itself (a ModelServerConfig text proto both TF Serving and serve-local
poll), plus an append-only history next to it. Module order: config (options) -> labels (which versions
the labels need) -> config_file (read, validate, write atomically) -> history -> steps (candidate, promote,
rollback), which wait for the server to apply a change through the shared client (trainserve.client).

Progressive delivery on live traffic (`trainserve rollout`): plan (the steps) -> prometheus (the query client)
-> analysis (queries and a step's verdict) -> progress (where a rollout stands, from the history) -> moves (the
proxy's routing file, the `candidate` label) -> follow (whether every proxy replica runs a routing change)
-> ends (rollback, promotion, pause, each writing the decision report: the report sub-package) -> controller (the
loop); dry_run prints it all.
"""
