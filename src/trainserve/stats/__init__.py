"""Statistics with one home: intervals, tests, power, multiplicity, the flip-rate bound, PSI and Jensen-Shannon.

Pure functions on numbers and arrays. Evaluation, evidence, replay and drift import from here; this package imports
no stage (and no TensorFlow), so every rule a gate applies is written once and checked against scipy/statsmodels
in the tests."""
