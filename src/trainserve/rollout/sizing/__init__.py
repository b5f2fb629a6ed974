"""The plan `auto`: a rollout's steps sized to the model's own traffic, and what any plan should take, said before
it starts.

    traffic    the model's request rate (the slowest hour at the plan's time of day over the last days, else the
               last hour) and stable's error share, read from the proxy's series in Prometheus
    simulate   a step's looks at that rate, judged by the controller's own checks (trainserve.rollout.analysis) for
               a candidate inside every budget: when it would pass, the chance it holds past its hold, and the
               canary requests a failing candidate would answer
    choose     the plan: a shadow step, then the smallest canary share whose steps decide within --max-duration,
               each step's duration the median time its checks need and its hold their 99th percentile; refused,
               before anything moves, when no share decides in time or the first look's exposure exceeds
               --max-exposure
"""
