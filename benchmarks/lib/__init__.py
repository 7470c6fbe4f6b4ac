"""The benchmarks' shared library; the ``bench_*.py`` scripts beside this package are
what one runs (``python benchmarks/bench_fleet.py --quick``). A script says what it
measures (its scenarios, its options) and how it reports (its tables); the machinery is
here, written once.

- ``common``: statistics, tables, the JSON results and the machine's description;
  paired runs in a rotated order (``paired_blocks``); a fleet of processes started
  together (``process_fleet``); the package's log counted (``package_log``); a store
  from its kind (``open_store``); a fast loopback keep-alive server in a process of its
  own; a private ``redis-server`` or Redis Cluster (the package's test harness,
  ``retry_after_adapter.testing.redis``);
- ``servers``: loopback servers on threads of the benchmark's own process (a counting
  server for ``bench_faults.py``, a slow one for ``bench_cold_start.py``);
- ``fleet``: the fleets of workers against a ``QuotaServer``, in threads or in
  processes, and the analysis of its log (early sends, 429s, overruns);
- ``express``: a real express-rate-limit server (Node) for ``bench_fleet.py --headers``;
- ``load``: the load fleet of worker processes on one store, its measured window, and
  what Redis was asked meanwhile (``bench_load.py``, ``bench_scale.py``);
- ``scenario``: a scripted scenario, the learned rate's sampler and the SVG picture
  (``bench_scenarios.py``);
- ``llm``: the OpenAI and Anthropic clients and their workers (``bench_llm.py``,
  ``bench_tokens.py``).

No script imports another: what two share lives here.
"""
