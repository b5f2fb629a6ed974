"""What an eval report proves, shared by the stage that writes it (evaluation) and the one that acts on it
(rollout): the report's schema, its strict reading, and the decision re-derived from its numbers."""
