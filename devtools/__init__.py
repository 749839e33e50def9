"""Development tools, not part of the runtime package (never in a wheel or a
scrapyd egg): embedded local servers (:mod:`devtools.services`: Redis, Redis
Cluster, a MongoDB-wire server) and the demo shop (:mod:`devtools.demo`), used
by the tests, the benchmarks and ``deploy/demo.sh``."""
