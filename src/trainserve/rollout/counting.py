"""A step's count of one counter kept per proxy replica, so that a replica's missed scrape or restart neither
re-bases nor inflates the step.

Each look brings one answer per counter: the replicas Prometheus scraped successfully, by instance, with the
counter's value (0 for a replica scraped without the series yet). Against the values last seen:

    seen before, value not lower   the increase since, added
    seen before, value lower       the replica restarted (its counters began again at 0): its value, the calls
                                   since the restart, added
    not in the answer              missed (its last scrape failed: Prometheus marked its series stale) or gone:
                                   nothing added, its last value remembered, so that when it answers again only
                                   its increase since then is added
    seen for the first time        its value is where it starts: what it counted before is not known to be this
                                   step's, so none of it is added

So a step's count is never more than the calls the replicas counted between the looks that saw them.
"""

from __future__ import annotations


def tallied(seen: dict[str, int], counted: int, answer: dict[str, float]) -> tuple[dict[str, int], int]:
    """(the values last seen by instance, the step's count) after one `answer` (instance -> value now)."""
    seen = dict(seen)
    for instance, value in answer.items():
        now, last = int(round(value)), seen.get(instance)
        if last is not None:
            counted += now - last if now >= last else now
        seen[instance] = now
    return seen, counted
