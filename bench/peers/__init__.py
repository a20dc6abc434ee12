"""The peers' side of bench.compare: imported only by the interpreter of .venv-peers/.

Each module here is one peer job queue's app (the tasks its workers run) and its producer
(a small command line, see `_cli`). They import the peer libraries, which the project's
own venv does not have: bench.compare runs them with the peers venv's python.
"""
