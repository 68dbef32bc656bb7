"""The test rigs, kept out of the wheel: a loopback server that speaks SGLang's `/generate` contract (and OpenAI's chat
API for the user simulator), namespaced hosts (root, network and mount namespaces, one sshd each), and storage
that fills up (full_storage: a small tmpfs, a file to its end).

Tests and benchmarks import them as `support.*` (pytest puts tests/ on sys.path; bench/ scripts add it themselves);
tests/conftest.py also puts tests/ on PYTHONPATH, so `python -m support.loopback_server` runs in a test's child.
"""
