"""What share of the requests a sticky canary gets: sticky routing splits callers, not requests, so a canary of 5 %
of the callers carries whatever those callers send. Callers' request counts follow Zipf's law (the caller of rank r
sends in proportion to 1 / r**s, a seeded draw of the requests), each rollout's canary is the callers whose salted
hash (trainserve.proxy.routing, the proxy's own code) falls under the share, and a new salt per rollout (model
and candidate) picks other callers. Prints, over many salts, the canary's share of the requests against its share
of the callers.

    python bench/sticky_share.py [--callers 10000] [--requests 1000000] [--share 5] [--rollouts 200] [--s 1.1]
"""

from __future__ import annotations

import argparse

import numpy as np

from trainserve.proxy.routing import ModelRoute


def request_counts(callers: int, requests: int, s: float, seed: int) -> np.ndarray:
    """Requests per caller: `requests` drawn among callers with Zipf weights 1 / rank**s (seeded)."""
    weights = 1.0 / np.arange(1, callers + 1) ** s
    return np.random.default_rng(seed).multinomial(requests, weights / weights.sum())


def canary_shares(counts: np.ndarray, share: float, rollouts: int) -> np.ndarray:
    """For each rollout (salt "bench:<i>"), the share of the requests its sticky canary of `share` % answers."""
    names = [f"caller-{i}" for i in range(len(counts))]
    out = []
    for rollout in range(rollouts):
        route = ModelRoute(rollout, canary_percent=share, sticky_header="x-user-id", sticky_salt=f"bench:{rollout}")
        inside = np.fromiter((route.canary_share("bench", n, 1.0) for n in names), bool, len(names))
        out.append(counts[inside].sum() / counts.sum())
    return np.array(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--callers", type=int, default=10_000, help="distinct header values")
    parser.add_argument("--requests", type=int, default=1_000_000, help="requests drawn among them")
    parser.add_argument("--share", type=float, default=5.0, help="canary_percent")
    parser.add_argument("--rollouts", type=int, default=200, help="salts tried (one per rollout)")
    parser.add_argument("--s", type=float, default=1.1, help="Zipf exponent")
    parser.add_argument("--seed", type=int, default=0, help="seed of the request draw")
    args = parser.parse_args()
    counts = request_counts(args.callers, args.requests, args.s, args.seed)
    shares = canary_shares(counts, args.share, args.rollouts) * 100
    top = counts.max() / counts.sum() * 100
    print(f"{args.callers} callers, Zipf s={args.s}, {args.requests} requests; the busiest caller sends {top:.1f} %")
    print(f"canary of {args.share:g} % of the callers, over {args.rollouts} salts: share of the requests")
    q = np.percentile(shares, [0, 5, 50, 95, 100])
    print("  min {:.1f} %  p5 {:.1f} %  median {:.1f} %  p95 {:.1f} %  max {:.1f} %".format(*q))


if __name__ == "__main__":
    main()
