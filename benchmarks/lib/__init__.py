"""The benchmarks' shared library; the ``bench_*.py`` scripts beside this package are
what one runs (``python benchmarks/bench_fleet.py --quick``).

- ``common``: statistics, tables, the JSON results and the machine's description, a
  fast loopback keep-alive server in a process of its own, and a private
  ``redis-server`` or Redis Cluster (the package's test harness,
  ``retry_after_adapter.testing.redis``);
- ``fleet``: the fleets of workers against a ``QuotaServer`` and the analysis of its
  log (early sends, 429s, overruns);
- ``express``: a real express-rate-limit server (Node) for ``bench_fleet.py --headers``;
- ``load``: the load fleet of worker processes on one store, and what Redis was asked
  meanwhile (``bench_load.py``, ``bench_scale.py``);
- ``llm``: the OpenAI and Anthropic clients and their workers (``bench_llm.py``,
  ``bench_tokens.py``).

No script imports another: what two share lives here.
"""
