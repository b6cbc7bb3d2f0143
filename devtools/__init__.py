"""The development and test harness: a private helper and service processes
(harness/), the reliability suites (reliability/), the canary table the
environments' canary suites print. Not shipped: the wheel's package list
(pyproject.toml) leaves it out, and the tests, the benchmarks and the
environments' checks/ import it from the source tree."""
