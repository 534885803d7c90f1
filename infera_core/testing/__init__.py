"""Test helpers for Infera and its plugin authors.

* :mod:`infera_core.testing.fixtures` — pytest fixtures (auto-loaded through the
  ``pytest11`` entry point): ``infera_hooks``, ``etcd_server``, ``free_port``…
* :mod:`infera_core.util.net` — free ports, waiting for a port or URL.
* :mod:`infera_core.testing.etcd` — start a real etcd on loopback.
* :mod:`infera_core.testing.contracts` — contract test suites to subclass
  (``EngineAdapterContract``, ``ScorerContract``, ``FilterContract``, ``PickerContract``).
* :mod:`infera_core.testing.engine_contract` — the engine kit behind ``EngineAdapterContract``:
  its checks against a stand-in of the engine (``StandinEndpoints``) and the launcher-flag clash check.
* :mod:`infera_core.testing.plugins` — install a throw-away plugin distribution in a
  temp dir and run the real ``infera-run`` against it.
* :mod:`infera_core.testing.engine_env` — a fake engine venv (``make_engine_env``) for an
  adapter's interpreter probe, and golden-argv helpers (``launch_context``, ``flag``).
* :mod:`infera_core.testing.published` — what a launched worker published: its etcd record
  (``wait_registered``) and its KV events (``KvSubscriber``).
"""
