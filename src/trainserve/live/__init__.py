"""`trainserve live-eval`: live accuracy from labels that arrive later, joined to what each version really answered.

Every captured record holds the request, the answer the client got, the version that gave it and the request id
the client sent (`x-request-id`). Scoring those answers against late labels needs no server: it is a join. No
request is sent anywhere; the answers scored are the recorded ones.

Module order: config (flags) -> labels (the labels file, read once into compact sorted arrays) -> answers (what a
record holds: probabilities, or a regression model's predictions) -> calibration (the label-free estimate:
confidence-based performance estimation, calibrated on the version's held-out split) -> seen (which unlabelled
examples a version answered: retries) -> tally (additive counts: per version, window and slice) -> join (stream the
capture, join, count) -> gates (--min-accuracy, --max-drop, paired or unpaired) -> report (JSON, table) -> html ->
merge (shards) -> the watch across daily runs (`--state`: promotion, the serving config's stable version and
what it was promoted on -> sequential, its anytime-valid bounds -> state, what earlier runs counted -> watch) ->
commands (`live-eval`, `live-eval-merge`). A stage beside replay and drift, which also judge
captured traffic: it shares eval's reading of a classifier's answer (trainserve.class_scores), the --max-drop
grammar (trainserve.margins) and the statistics (trainserve.stats), and imports no other stage (the watch's
rollback is `trainserve rollback`'s step, wired in by trainserve.cli).
A regression model (one target) is scored the same way: MSE, RMSE and MAE with intervals, no label-free estimate.
"""
