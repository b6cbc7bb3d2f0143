"""Episodes, whatever the environment: the manager (ids, capacity, leases,
deadlines, steps) and what it delegates: admission, forks, regrades, null
proofs, outcome records with their signatures, submissions and cost."""
